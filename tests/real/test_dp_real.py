"""Issue 29, ranks from the real thing: a REAL 0.5.22 pair whose prefill and decode each run two DP ranks
(`--dp-size 2`), behind the real smg router with DP-aware routing, as kvgate's launcher starts it
(`PDLaunchPlan.dp_size`).

What the ranks say comes from the servers: `server_info` reports `dp_size` 2 and one `internal_states`
entry per rank, and smg lists each worker once per rank (`URL@0`, `URL@1`, each with `dp_base_url`).
`kvgate check` gates every rank of both roles and the router's view of them (metadata: the ranks are
what this test is about; the probes through the same pair were run once by hand, see README). Requests
through the router are then answered on both of the prefill's ranks: the launcher sets what SGLang's
follow_bootstrap_room placement needs beside smg's rank choice (launch.FORCE_QUERY_PREFILL_DP_RANK),
without which a run of the same pair failed about 4 requests in 10.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import httpx
import pytest
from typer.testing import CliRunner

from kvgate.cli import app
from kvgate.deploy.launch import PDDeployment
from tests.assets.real_sglang import server_env_or_skip
from tests.real.conftest import IDS, PairSpec, plan_for, report_of

pytestmark = [pytest.mark.slow, pytest.mark.real]

SPEC = PairSpec("0.5.22", "healthy", IDS, 4096, "llama")
RANKS = 2
REQUESTS = 8


@pytest.fixture(scope="module")
def dp_pair(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PDDeployment]:
    server_env_or_skip(SPEC.release)
    logs = tmp_path_factory.mktemp("real-dp2")
    dep = PDDeployment(replace(plan_for(SPEC), dp_size=RANKS), log_dir=logs)
    dep.start()
    try:
        yield dep
    finally:
        dep.stop()


def test_every_rank_of_a_dp_pair_is_read_from_the_servers_and_gated(dp_pair: PDDeployment, tmp_path: Path) -> None:
    assert dp_pair.router_url is not None
    workers = dp_pair.prefill_urls + dp_pair.decode_urls
    for url in workers:
        info = httpx.get(url + "/server_info", timeout=30).json()
        assert info["dp_size"] == RANKS and len(info["internal_states"]) == RANKS, (url, info.get("dp_size"))
    listed = httpx.get(dp_pair.router_url + "/workers", timeout=30).json()["workers"]
    entries = sorted((w.get("dp_base_url"), w["url"]) for w in listed)
    assert entries == sorted((u, f"{u}@{r}") for u in workers for r in range(RANKS)), entries

    out = tmp_path / "dp.json"
    args = [
        "check",
        "--prefill-url",
        dp_pair.prefill_urls[0],
        "--decode-url",
        dp_pair.decode_urls[0],
        "--router-url",
        dp_pair.router_url,
        "--site-packages",
        dp_pair.code_sources()["*"]["site_packages"],
        "--no-probes",
        "-f",
        "json",
        "-o",
        str(out),
        "-q",
    ]
    res = CliRunner().invoke(app, args)
    assert out.is_file(), res.output
    report = report_of(out)
    unpassed = [
        (f["check"], f["outcome"], f["summary"]) for f in report["findings"] if f["outcome"] not in ("passed", "info")
    ]
    assert res.exit_code == 0 and not unpassed, (res.exit_code, unpassed)
    passed = [(f"{f['gate']}.{f['check']}", f["node"]) for f in report["findings"] if f["outcome"] == "passed"]
    for url in workers:
        checks = {c for c, node in passed if url in node}
        want = {"pool-context.dp-ranks", *(f"pool-context.headroom-dp{r}" for r in range(RANKS))}
        assert want <= checks, (url, sorted(checks))
    assert any(c == "fleet.router-identity" for c, _ in passed), passed

    # Served through the router on both of the prefill's ranks (its log names the rank of each batch).
    body = {"input_ids": [1, 2, 3, 4], "sampling_params": {"max_new_tokens": 2, "temperature": 0.0}}
    with httpx.Client(timeout=60) as http:
        statuses = [http.post(dp_pair.router_url + "/generate", json=body).status_code for _ in range(REQUESTS)]
    assert statuses == [200] * REQUESTS, statuses
    assert dp_pair.log_dir is not None
    log = (dp_pair.log_dir / "prefill0.log").read_text(errors="replace")
    assert {int(r) for r in re.findall(r" DP(\d)\] Prefill batch", log)} == set(range(RANKS)), (
        "one rank never prefilled"
    )
    assert "follow_bootstrap_room conflict" not in log, json.dumps(statuses)


def test_the_dp_pair_passes_every_probe_at_the_defaults_the_handoff_check_included(
    dp_pair: PDDeployment, tmp_path: Path
) -> None:
    """The same started pair (no second real start), now probed: a whole `kvgate check` with no profile
    exits 0, `probes.handoff.prefill_oracle` judging decode's tokens against the prefill's own on both
    DP pairs' traffic, and `probes.pd.engaged` / `probes.pd.coverage` reading each worker's own counter."""
    assert dp_pair.router_url is not None and dp_pair.log_dir is not None
    prefill_log = dp_pair.log_dir / "prefill0.log"
    before = len(prefill_log.read_bytes())
    out = tmp_path / "dp-probes.json"
    args = ["check", "--prefill-url", dp_pair.prefill_urls[0], "--decode-url", dp_pair.decode_urls[0]]
    args += ["--router-url", dp_pair.router_url, "--site-packages", dp_pair.code_sources()["*"]["site_packages"]]
    res = CliRunner().invoke(app, [*args, "-f", "json", "-o", str(out), "-q"])
    assert out.is_file(), res.output
    report = report_of(out)
    unpassed = [
        (f["check"], f["outcome"], f["summary"][:400])
        for f in report["findings"]
        if f["outcome"] not in ("passed", "info")
    ]
    by = {f["check"]: f for f in report["findings"] if f["gate"] == "probes"}
    for check in ("handoff.prefill_oracle", "pd.engaged", "pd.coverage"):
        print(check, by.get(check, {}).get("outcome"), by.get(check, {}).get("summary"))
    assert res.exit_code == 0 and not unpassed, (res.exit_code, unpassed)
    for check in ("handoff.prefill_oracle", "pd.engaged", "pd.coverage"):
        assert by[check]["outcome"] == "passed", (check, by[check]["summary"])
    # SGLang counts requests per worker, not per rank (pd.coverage says so): the prefill's own log shows
    # that this run's probes were prefilled on both of its ranks.
    during = prefill_log.read_bytes()[before:].decode(errors="replace")
    ranks = {int(r) for r in re.findall(r" DP(\d)\] Prefill batch", during)}
    assert ranks == set(range(RANKS)), ranks

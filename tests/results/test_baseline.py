"""Baselines: record a fleet, then fail on every change until the baseline is renewed."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from typer.testing import CliRunner

from kvgate.cli import app
from kvgate.exitcodes import ExitStatus
from tests.assets import sglang_payloads as P
from tests.conftest import PayloadServer, Route

runner = CliRunner()
POOL = 2_040_000


def set_worker(srv: PayloadServer, mode: str, pool: int = POOL, **kw: Any) -> PayloadServer:
    srv.routes.update(
        {
            "/server_info": Route(P.server_info("0.5.22", mode=mode, pool=pool, **kw)),
            "/v1/models": Route(P.v1_models()),
            "/model_info": Route(P.model_info("0.5.22", mode)),
        }
    )
    return srv


def check(*args: str) -> Any:
    # Payload servers run no sglang code: their version string is the evidence (said explicitly).
    return runner.invoke(app, ["check", "--quiet", "--format", "json", "--trust-version", "--no-strict", *args])


def baseline_findings(res: Any) -> list[dict[str, Any]]:
    return [f for f in json.loads(res.stdout)["findings"] if f["gate"] == "baseline"]


def test_round_trip_then_a_pool_change_fails_naming_worker_and_both_values(
    payload_server: Callable[..., PayloadServer], tmp_path: Path
) -> None:
    p, d = set_worker(payload_server(), "prefill"), set_worker(payload_server(), "decode")
    nodes = ["--prefill-url", p.url, "--decode-url", d.url]
    base = tmp_path / "baseline.json"
    res = check(*nodes, "--write-baseline", str(base))
    assert res.exit_code == ExitStatus.PASSED, res.output
    wrote = baseline_findings(res)
    assert [(f["check"], f["outcome"]) for f in wrote] == [("write", "passed")]
    text = base.read_text()
    doc = json.loads(text)
    assert text == json.dumps(doc, indent=2, sort_keys=True) + "\n"  # plain, diffable
    assert doc["schema_version"] == 1 and doc["kind"] == "kvgate-baseline"
    rec = doc["workers"][p.url]
    assert rec["pool"] == POOL and rec["role"] == "prefill" and rec["release"] == "0.5.22"
    assert rec["context"] == 1_048_576 and rec["page_size"] == 64 and rec["tp_size"] == 8
    assert rec["transfer_backend"] == "mooncake" and rec["max_req_input_len"] == 1_048_570
    assert rec["code"]["code"] == "version string 0.5.22 only, code not read" and set(rec["defenses"]) == {
        "kv_checksum",
        "kv_canary",
        "deferred_release_env",
    }

    same = check(*nodes, "--baseline", str(base))
    assert same.exit_code == ExitStatus.PASSED, same.output
    assert {f["outcome"] for f in baseline_findings(same)} == {"passed"}

    set_worker(p, "prefill", pool=1_500_000)  # capacity changed between runs (still above headroom)
    drifted = check(*nodes, "--baseline", str(base))
    assert drifted.exit_code == ExitStatus.GATE_FAILED, drifted.output
    bad = [f for f in baseline_findings(drifted) if f["outcome"] == "failed"]
    assert {f["node"] for f in bad} == {f"prefill[0] {p.url}"}
    pool = [f for f in bad if f["evidence"][0]["field"] == "pool"][0]
    assert "2,040,000 -> 1,500,000" in pool["summary"]
    assert pool["evidence"][0]["value"] == 1_500_000 and "2,040,000" in pool["evidence"][0]["expected"]
    assert {f["evidence"][0]["field"] for f in bad} == {"pool", "dp_pools"}  # max_req_input_len held (> context)

    # Compare, then renew: the run that found the drift failed, so it does not renew the baseline, and
    # the same command again (a CI retry, nothing reviewed) still fails.
    before = base.read_bytes()
    for _ in range(2):
        retry = check(*nodes, "--baseline", str(base), "--write-baseline", str(base))
        assert retry.exit_code == ExitStatus.GATE_FAILED, retry.output
        write = [f for f in baseline_findings(retry) if f["check"] == "write"]
        assert [f["outcome"] for f in write] == ["inconclusive"]
        assert "baseline not renewed" in write[0]["summary"] and "did not pass (exit 1" in write[0]["summary"]
        assert "baseline.drift" in write[0]["summary"]
        assert base.read_bytes() == before
    # After review, a run that passes renews it (without --baseline: the change is what was reviewed).
    renew = check(*nodes, "--write-baseline", str(base))
    assert renew.exit_code == ExitStatus.PASSED, renew.output
    assert [f["outcome"] for f in baseline_findings(renew)] == ["passed"]
    assert check(*nodes, "--baseline", str(base)).exit_code == ExitStatus.PASSED


def test_a_failing_run_writes_no_first_baseline_either(
    payload_server: Callable[..., PayloadServer], tmp_path: Path
) -> None:
    p, d = set_worker(payload_server(), "prefill", pool=500_000), set_worker(payload_server(), "decode")
    base = tmp_path / "baseline.json"
    res = check("--prefill-url", p.url, "--decode-url", d.url, "--write-baseline", str(base))
    assert res.exit_code == ExitStatus.GATE_FAILED, res.output
    write = [f for f in baseline_findings(res) if f["check"] == "write"]
    assert write[0]["outcome"] == "inconclusive" and "nothing written" in write[0]["summary"]
    assert "pool-context.headroom" in write[0]["summary"] and not base.exists()


def test_an_inconclusive_run_does_not_renew(payload_server: Callable[..., PayloadServer], tmp_path: Path) -> None:
    p, d = set_worker(payload_server(), "prefill"), set_worker(payload_server(), "decode")
    nodes = ["--prefill-url", p.url, "--decode-url", d.url]
    base = tmp_path / "baseline.json"
    assert check(*nodes, "--write-baseline", str(base)).exit_code == ExitStatus.PASSED
    before = base.read_bytes()
    # The same run under --strict: the probes did not run for want of a router, which is doubt (exit 3).
    strict = ["check", "--quiet", "--format", "json", "--trust-version", "--strict"]
    res = runner.invoke(app, [*strict, *nodes, "--write-baseline", str(base)])
    assert res.exit_code == ExitStatus.INCONCLUSIVE, res.output
    write = [f for f in baseline_findings(res) if f["check"] == "write"]
    assert write[0]["outcome"] == "inconclusive" and f"{base} left as it was" in write[0]["summary"]
    assert "exit 3" in write[0]["summary"] and base.read_bytes() == before


def test_workers_added_and_removed_are_named(payload_server: Callable[..., PayloadServer], tmp_path: Path) -> None:
    p, d = set_worker(payload_server(), "prefill"), set_worker(payload_server(), "decode")
    extra = set_worker(payload_server(), "decode")
    base = tmp_path / "b.json"
    assert check("--prefill-url", p.url, "--decode-url", d.url, "--write-baseline", str(base)).exit_code == 0
    added = check("--prefill-url", p.url, "--decode-url", d.url, "--decode-url", extra.url, "--baseline", str(base))
    assert added.exit_code == ExitStatus.GATE_FAILED
    assert [(f["check"], f["node"]) for f in baseline_findings(added) if f["outcome"] == "failed"] == [
        ("added", f"decode[1] {extra.url}")
    ]
    removed = check("--prefill-url", p.url, "--baseline", str(base))
    assert removed.exit_code == ExitStatus.GATE_FAILED
    assert [(f["check"], f["node"]) for f in baseline_findings(removed) if f["outcome"] == "failed"] == [
        ("removed", f"worker {d.url}")
    ]


def test_an_unread_worker_is_unknown_not_removed_and_blocks_writing(
    payload_server: Callable[..., PayloadServer], tmp_path: Path
) -> None:
    p, d = set_worker(payload_server(), "prefill"), set_worker(payload_server(), "decode")
    base = tmp_path / "b.json"
    assert check("--prefill-url", p.url, "--decode-url", d.url, "--write-baseline", str(base)).exit_code == 0
    d.routes["/server_info"] = Route({"detail": "down"}, status=503)
    renewed = tmp_path / "renewed.json"
    res = check(
        "--prefill-url", p.url, "--decode-url", d.url, "--baseline", str(base), "--write-baseline", str(renewed)
    )
    assert res.exit_code == ExitStatus.TRANSPORT_ERROR
    got = {(f["check"], f["outcome"]) for f in baseline_findings(res) if d.url in f["node"] or f["check"] == "write"}
    assert got == {("drift", "inconclusive"), ("write", "inconclusive")}
    assert not renewed.exists()


def test_bad_baseline_files_are_usage_errors_naming_the_file(tmp_path: Path) -> None:
    cases = {
        "missing.json": None,
        "garbage.json": "{nope",
        "other.json": '{"kind": "x"}',
        "future.json": '{"kind": "kvgate-baseline", "schema_version": 99, "workers": {}}',
    }
    for name, text in cases.items():
        path = tmp_path / name
        if text is not None:
            path.write_text(text)
        res = runner.invoke(app, ["check", "--quiet", "--prefill-url", "http://127.0.0.1:1", "--baseline", str(path)])
        assert res.exit_code == ExitStatus.USAGE_ERROR, (name, res.output)
        assert str(path) in res.stderr

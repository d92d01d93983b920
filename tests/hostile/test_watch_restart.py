"""Issue 40, class 3, rebuilt: a restart is a new deployment.

`kvgate watch` took `startup_time` for volatile: workers that restarted on another build, with the same
flags and version label, were never re-gated, and /verdict stayed 200 until the hourly re-gate while
`kvgate check` at the same moment exited 1. Here the workers (loopback sockets behind an smg-shaped
router) run the code of a REAL 0.5.23 wheel tree (`--site-packages`); they restart on a build of the
same version whose #38935 call site is commented out. Their answers differ only in their startup
times. The watch logs the process old -> new, re-gates, code scan included, and /verdict fails within
one interval, as `check` does.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from kvgate.cli import app
from kvgate.exitcodes import ExitStatus
from tests.assets import router_payloads as R
from tests.assets import sglang_payloads as P
from tests.catalogue.helpers import copy_signature_tree
from tests.conftest import PayloadServer, Route
from tests.watch.helpers import Timeline, WatchProcess

pytestmark = pytest.mark.wheels
runner = CliRunner()
CONTEXT = 8192
POOL = 40_960
INTERVAL = 2
GATE_S = 120.0  # a bound on a metadata-only gate on a busy machine (a wait, not an assertion)
CALL = "        if is_unadmitted_reject(req):\n"


def routes(mode: str, started: float) -> dict[str, Route]:
    info = P.server_info("0.5.23", mode=mode, context=CONTEXT, pool=POOL)
    info["startup_time"] = started
    for state in info["internal_states"]:
        state["startup_time"] = started + 1.5
    return {
        "/server_info": Route(info),
        "/v1/models": Route(P.v1_models(CONTEXT)),
        "/model_info": Route(P.model_info("0.5.23", mode)),
    }


def builds(tmp_path: Path) -> tuple[Path, Path, Path]:
    """The build the workers run (`current`, a link), the real one and one whose fix does not run."""
    good, bad = tmp_path / "build-good", tmp_path / "build-bad"
    copy_signature_tree("0.5.23", good / "sglang")
    copy_signature_tree("0.5.23", bad / "sglang")
    path = bad / "sglang/srt/disaggregation/prefill.py"
    text = path.read_text()
    assert text.count(CALL) == 1
    path.write_text(text.replace(CALL, "        if False:  # if is_unadmitted_reject(req):\n"))
    current = tmp_path / "current"
    current.symlink_to(good, target_is_directory=True)
    return current, good, bad


def check(router: str, site: Path) -> tuple[int, dict[str, Any]]:
    res = runner.invoke(app, ["check", "--router-url", router, *opts(site), "--quiet", "--format", "json"])
    return res.exit_code, json.loads(res.stdout) if res.stdout.startswith("{") else {}


def opts(site: Path) -> list[str]:
    # payload servers and no probes: said explicitly, as a pipeline would
    return ["--no-probes", "--no-strict", "--deferred-release", "--site-packages", str(site)]


def test_workers_restarted_on_another_build_flip_the_verdict_within_one_interval(
    payload_server: Callable[..., PayloadServer], tmp_path: Path
) -> None:
    current, _, bad = builds(tmp_path)
    prefill = payload_server(routes("prefill", 1_790_000_000.0))
    decode = payload_server(routes("decode", 1_790_000_000.0))
    listing = R.smg_workers(R.smg_entry(prefill.url, "prefill", bootstrap_port=8998), R.smg_entry(decode.url, "decode"))
    router = payload_server({"/workers": Route(listing), "/readiness": Route({"status": "ready"})})
    code, report = check(router.url, current)
    assert code == ExitStatus.PASSED, [f for f in report.get("findings", []) if f["outcome"] not in ("passed", "info")]

    w = WatchProcess(["--router-url", router.url, *opts(current), "--interval", str(INTERVAL)], tmp_path / "w.log")
    try:
        w.wait(lambda: (res := w.get("/verdict")) is not None and res.status_code == 200, GATE_S, "a passing gate")
        with Timeline(w) as tl:
            w.wait(lambda: len(tl.pass_ends) >= 2, INTERVAL * 10 + GATE_S, "two passes over the fleet")
            assert len(tl.verdicts) == 1 and "change:" not in w.log(), w.log()
            # The restart: the same flags, the same version label, another build; only the startup times move.
            t_restart = time.monotonic()
            os.replace(_relinked(current, bad), current)
            prefill.routes = routes("prefill", 1_790_000_900.0)
            decode.routes = routes("decode", 1_790_000_900.0)
            now_code, now_report = check(router.url, current)
            assert now_code == ExitStatus.GATE_FAILED, now_report.get("findings")
            w.wait(
                lambda: any(v.exit_status == 1 and v.http == 503 and v.t > t_restart for v in tl.verdicts),
                INTERVAL * 10 + GATE_S,
                "a verdict that fails the restarted build",
            )
            flip = next(v for v in tl.verdicts if v.exit_status == 1 and v.http == 503 and v.t > t_restart)
            assert "defenses.release" in flip.reason, flip
            # Within one interval: at most the pass in flight at the restart and the next one ended first.
            assert len(tl.passes_between(t_restart, flip.t)) <= 2, (tl.pass_ends, t_restart, flip)
        log = w.log()
        for worker in (prefill.url, decode.url):
            assert f"change: {worker}: process " in log and "restarted: a new worker" in log, log
        assert "1790000000.0" in log and "1790000900.0" in log, log  # old -> new
        assert "full gate (change): gate_failed (exit 1)" in log, log
    finally:
        assert w.terminate() == 0


def _relinked(link: Path, target: Path) -> Path:
    """A new link to `target` beside `link`, to be renamed over it (the build swapped in one step)."""
    new = link.with_name(link.name + ".new")
    new.symlink_to(target, target_is_directory=True)
    return new

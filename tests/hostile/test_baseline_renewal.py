"""Issue 40, class 5, rebuilt: a failing run renewed the baseline.

With `--baseline B --write-baseline B` (compare, then renew), the run that reports a defense turned
off exited 1 but rewrote B, and the same command again (a CI retry, nothing reviewed) exited 0. A
baseline is now renewed only by a run that passed; the run says it left B as it was, and why.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from typer.testing import CliRunner

from kvgate.cli import app
from kvgate.exitcodes import ExitStatus
from kvgate.upstream.releases import DEFERRED_ENV
from tests.assets import sglang_payloads as P
from tests.conftest import PayloadServer, Route

runner = CliRunner()


def _worker(srv: PayloadServer, mode: str, deferred: str) -> PayloadServer:
    srv.routes.update(
        {
            "/server_info": Route(
                P.server_info("0.5.22", mode=mode, pool=2_040_000, env_vars={DEFERRED_ENV: deferred})
            ),
            "/v1/models": Route(P.v1_models()),
            "/model_info": Route(P.model_info("0.5.22", mode)),
        }
    )
    return srv


def _check(*args: str) -> Any:
    # Payload servers run no sglang code: their version string is taken as evidence, explicitly.
    return runner.invoke(app, ["check", "--quiet", "--format", "json", "--trust-version", "--no-probes", *args])


def test_a_run_that_turns_a_defense_off_does_not_renew_and_the_retry_still_blocks(
    payload_server: Callable[..., PayloadServer], tmp_path: Path
) -> None:
    p, d = _worker(payload_server(), "prefill", "1"), _worker(payload_server(), "decode", "1")
    nodes = ["--prefill-url", p.url, "--decode-url", d.url]
    base = tmp_path / "B.json"
    first = _check(*nodes, "--write-baseline", str(base))
    assert first.exit_code == ExitStatus.PASSED, first.output
    recorded = base.read_bytes()
    assert json.loads(recorded)["workers"][d.url]["defenses"]["deferred_release_env"] == "1"

    _worker(d, "decode", "0")  # the defense turned off on the decode
    for attempt in ("run", "retry"):
        res = _check(*nodes, "--baseline", str(base), "--write-baseline", str(base))
        assert res.exit_code == ExitStatus.GATE_FAILED, (attempt, res.output)
        findings = json.loads(res.stdout)["findings"]
        failed = {f["id"] for f in findings if f["outcome"] == "failed"}
        assert {"defenses.deferred-release", "baseline.drift"} <= failed, (attempt, failed)
        (write,) = [f for f in findings if f["id"] == "baseline.write"]
        assert write["outcome"] == "inconclusive", (attempt, write)
        assert f"baseline not renewed ({base} left as it was)" in write["summary"]
        assert "defenses.deferred-release" in write["summary"] and "exit 1" in write["summary"]
        assert base.read_bytes() == recorded, attempt

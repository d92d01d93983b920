"""`kvgate check --model-config`: a gate-1 failure explained with the plan's knobs, against real loopback servers."""

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
DSA = str(Path(__file__).resolve().parent / "model_configs" / "deepseek-v32-dsa.json")


def worker(make: Callable[..., PayloadServer], mode: str, pool: int, version: str = "0.5.22") -> PayloadServer:
    return make(
        {
            "/server_info": Route(P.server_info(version, mode=mode, context=1_048_576, pool=pool)),
            "/v1/models": Route(P.v1_models(1_048_576)),
            "/model_info": Route(P.model_info(version, mode)),
        }
    )


def headroom_findings(res: Any) -> list[dict[str, Any]]:
    doc = json.loads(res.stdout)
    return [f for f in doc["findings"] if f["gate"] == "pool-context" and f["check"].startswith("headroom")]


def test_incident_pool_is_explained_with_knobs_that_reproduce_the_observed_pool(
    payload_server: Callable[..., PayloadServer],
) -> None:
    p = worker(payload_server, "prefill", 681_280)
    d = worker(payload_server, "decode", 2_040_000)
    res = runner.invoke(
        app,
        ["check", "--quiet", "--prefill-url", p.url, "--decode-url", d.url, "--model-config", DSA, "--format", "json"],
    )
    assert res.exit_code == ExitStatus.GATE_FAILED, res.output
    failed = [f for f in headroom_findings(res) if f["outcome"] == "failed"]
    assert failed and all(f["node"].startswith("prefill") for f in failed)
    for f in failed:
        ev = {e["field"]: (e["value"], e["expected"]) for e in f["evidence"]}
        assert ev["plan max_total_num_tokens"][0] == 681_280  # the plan reproduces what the engine sized
        assert ev["plan gpu_memory_gib"][1].startswith("CALIBRATED")
        assert ev["plan release"][0] == "0.5.22"
        assert f["remedy"].startswith("kvgate plan: any one of:")
        assert "--context-length 1048576 -> " in f["remedy"]
    passed = [f for f in headroom_findings(res) if f["outcome"] == "passed"]
    assert passed and all("remedy" not in f or f["remedy"] is None for f in passed)


def test_a_plan_that_does_not_reproduce_the_pool_offers_no_knobs(
    payload_server: Callable[..., PayloadServer], tmp_path: Path
) -> None:
    p = worker(payload_server, "prefill", 681_280)
    prof = tmp_path / "p.yaml"
    # A stated free-memory figure that cannot give the observed pool.
    prof.write_text(f"schema: 1\nname: t\ndeployment:\n  model_config: {DSA}\n  gpu_memory_gib: 300\n")
    res = runner.invoke(app, ["check", "--quiet", "--prefill-url", p.url, "--profile", str(prof), "--format", "json"])
    assert res.exit_code == ExitStatus.GATE_FAILED
    for f in (f for f in headroom_findings(res) if f["outcome"] == "failed"):
        ev = {e["field"]: (e["value"], e["expected"]) for e in f["evidence"]}
        assert "does not reproduce" in ev["plan"][1]
        assert not f["remedy"].startswith("kvgate plan")


def test_a_bad_model_config_is_a_usage_error_before_any_request(tmp_path: Path) -> None:
    missing = tmp_path / "nope.json"
    res = runner.invoke(
        app, ["check", "--quiet", "--prefill-url", "http://127.0.0.1:9", "--model-config", str(missing)]
    )
    assert res.exit_code == ExitStatus.USAGE_ERROR and "cannot read" in res.stderr

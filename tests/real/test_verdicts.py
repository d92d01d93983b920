"""`kvgate check` against the REAL server of every release: the verdict each release deserves.

- pool below the context ("short"): 0.5.19 is blocked by the probes themselves, the over-limit request
  named as served (contract) and shown to be answered from other tenants' pages (isolation), in both
  server modes; pool-context fails on every release (the pool really is short).
- healthy pool: no failed pool-context or probe finding on any release; nothing failed at all on
  0.5.22 and 0.5.23 (a gate that blocks a safe deployment gets switched off).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from kvgate.cli import app
from kvgate.paths import profiles_dir
from tests.real.conftest import RealPair, report_of

pytestmark = [pytest.mark.slow, pytest.mark.real]
runner = CliRunner()


# A short pool on 0.5.20+ starves the real decode for 300 s (README, "What the real server showed"), so
# every probe sent after the over-limit ones waits out its deadline: fewer sequential latency and abort
# tries keep that pair's cost bounded. The verdict is decided before them (pool-context, contract).
def _short_profile(path: Path) -> str:
    """The bundled cpu-tiny profile with fewer sequential latency and abort tries (nothing else changed)."""
    doc = yaml.safe_load((profiles_dir() / "cpu-tiny.yaml").read_text())
    doc["name"] = "cpu-tiny-short"
    doc["probes"].update({"tenants": 8, "latency_samples": 3, "abort_attempts": 1})
    path.write_text(yaml.safe_dump(doc))
    return str(path)


def _check(pair: RealPair, tmp_path: Path) -> tuple[int, dict]:
    out = tmp_path / f"{pair.spec.id}.json"
    profile = "cpu-tiny"
    if pair.spec.kind == "short":
        profile = _short_profile(tmp_path / "cpu-tiny-short.yaml")
    res = runner.invoke(app, pair.check_args() + ["--profile", profile, "-f", "json", "-o", str(out), "-q"])
    assert out.is_file(), res.output
    return res.exit_code, report_of(out)


def _failed(report: dict, gate: str | None = None) -> list[dict]:
    return [f for f in report["findings"] if f["outcome"] == "failed" and (gate is None or f["gate"] == gate)]


def _one(report: dict, check: str) -> dict:
    found = [f for f in report["findings"] if f["check"] == check]
    assert found, f"no {check} finding in {[f['check'] for f in report['findings']]}"
    return found[0]


def test_check_gives_the_release_its_verdict(real_pair: RealPair, tmp_path: Path) -> None:
    spec = real_pair.spec
    code, report = _check(real_pair, tmp_path)
    summary = "\n".join(
        f"{f['outcome']} {f['check']}: {f['summary'][:600]}" for f in report["findings"] if f["outcome"] != "passed"
    )
    if spec.kind == "healthy":
        assert not _failed(report, "pool-context"), summary
        probe_failures = _failed(report, "probes")
        if spec.release == "0.5.20":
            # Real 0.5.20 (no #38935): in the 6-token abort band the prefill retires the request after its
            # forward and sends no KV, while the decode admitted it and waits for that KV until its 300 s
            # waiting timeout: a streaming client hangs. A real defect even with a healthy pool, so the
            # only probe failure allowed here is that hang (the issue expected none; the server decides).
            probe_failures = [
                f
                for f in probe_failures
                if not (
                    f["check"] in ("contract.pool_limit", "contract.reject_band_middle")
                    and f["summary"].startswith("hang")
                )
            ]
        assert not probe_failures, summary
        if spec.release in ("0.5.22", "0.5.23"):
            assert not _failed(report), summary
            assert code in (0, 3), summary  # 3 only for what could not be observed, never a block
        return
    assert code == 1, summary
    assert any(f["check"] == "headroom" for f in _failed(report, "pool-context")), summary
    if spec.release == "0.5.19":
        contract = _one(report, "contract.pool_limit")
        assert contract["outcome"] == "failed" and contract["summary"].startswith("served_over_limit"), contract
        iso = _one(report, "isolation.greedy_replay")
        assert iso["outcome"] == "failed" and "stale KV" in iso["summary"], iso
    else:
        # From 0.5.20 on the prefill rejects the over-pool prompt: no probe sees it served. The decode is
        # not told and holds the reservation of every rejected STREAMING request for its 300 s waiting
        # timeout, so a pair the differential test probed just before is still starved: the probes may
        # stop early ("not sent"), and the isolation check may not run at all; it must never fail.
        assert not [f for f in _failed(report, "probes") if f["check"] == "isolation.greedy_replay"], summary
        assert not [f for f in _failed(report, "probes") if f["summary"].startswith("served_over_limit")], summary


def test_plan_predicts_the_pool_the_real_server_sized(real_pair: RealPair, tmp_path: Path) -> None:
    """`kvgate plan` for the tiny model with the pair's --max-total-tokens gives what each real worker reports."""
    from kvgate.cpuserver.model import tiny_model
    from kvgate.target import NodeSpec, TargetClient

    spec = real_pair.spec
    with TargetClient(timeout=30.0) as client:
        readings = {
            role: client.read_node(NodeSpec(role, url))
            for role, url in (("prefill", real_pair.prefill), ("decode", real_pair.decode))
        }
    for role, reading in readings.items():
        cap = spec.prefill_pool if role == "prefill" else spec.decode_pool
        out = tmp_path / f"plan-{role}.json"
        # Free memory is not what binds on a CPU pair with a cap: any figure whose budget exceeds the cap.
        res = runner.invoke(
            app,
            [
                "plan",
                "--model-config",
                str(tiny_model() / "config.json"),
                "--tp",
                "1",
                "--gpu-memory-gib",
                "64",
                "--weights-gib",
                "0.01",
                "--mem-fraction-static",
                "0.05",
                "--max-total-tokens",
                str(cap),
                "--context-length",
                "8192",
                "--release",
                spec.release,
                "-f",
                "json",
                "-o",
                str(out),
            ],
        )
        assert out.is_file(), res.output
        predicted = report_of(out)["target"]["prefill"]
        assert predicted["max_total_num_tokens"] == reading.max_total_num_tokens, (role, predicted, reading)
        assert predicted["max_req_input_len"] == reading.max_req_input_len, (role, predicted, reading)

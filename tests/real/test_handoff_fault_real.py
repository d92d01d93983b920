"""Issue 39's real proof: `probes.handoff.prefill_oracle` fails a REAL 0.5.22 decode that misreads its KV.

A TEST hook (`_zero_received_layer.py`, loaded into the tier's fault pair through KVGATE_TEST_HOOK:
conftest's `decode_fault_pair`, which test_isolation_fault_real.py shares, its own fault off meanwhile)
zeroes layer 0's received values at every request's prompt slots when the real decode commits the
transfer: what a transfer that drops one layer's buffer leaves, the same way every time, with nothing
foreign in it. The first output token is prefill's (the metadata buffer), every later one the decode's
over the damaged KV. Two phases on one pair, each a whole `kvgate check` with no profile, through the
real router:
1. hook off: exit 0, the handoff check passed (the hook is inert, the pair healthy);
2. zero-layer: exit 1 on the handoff check alone; every other probe passes the same pair (replay agrees
   with itself, no sentinel moves, every contract holds).
The hook logs what it did (`events.jsonl`): a phase that injected nothing is an error, never a verdict.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from kvgate.cli import app
from kvgate.deploy.launch import PDDeployment
from tests.real.conftest import FaultPair, report_of

pytestmark = [pytest.mark.slow, pytest.mark.real]
runner = CliRunner()

HANDOFF = "handoff.prefill_oracle"


def _events(folder: Path) -> list[dict]:
    path = folder / "events.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def _check(dep: PDDeployment, out: Path) -> tuple[int, dict]:
    assert dep.router_url is not None
    args = ["check", "--prefill-url", dep.prefill_urls[0], "--decode-url", dep.decode_urls[0]]
    args += ["--router-url", dep.router_url, "--site-packages", dep.code_sources()["*"]["site_packages"]]
    res = runner.invoke(app, [*args, "-f", "json", "-o", str(out), "-q"])
    assert out.is_file(), res.output
    return res.exit_code, report_of(out)


def _not_passed(report: dict) -> list[str]:
    return [
        f"{f['outcome']} {f['check']}: {f['summary'][:400]}"
        for f in report["findings"]
        if f["outcome"] not in ("passed", "info")
    ]


def test_the_handoff_check_alone_fails_a_real_decode_that_misreads_its_kv(
    decode_fault_pair: FaultPair, tmp_path: Path
) -> None:
    dep, folder = decode_fault_pair.deployment, decode_fault_pair.handoff
    try:
        _both_phases(dep, folder, tmp_path)
    finally:
        (folder / "mode").write_text("off")  # the pair goes on to test_isolation_fault_real.py as it came


def _both_phases(dep: PDDeployment, folder: Path, tmp_path: Path) -> None:
    code, healthy = _check(dep, tmp_path / "off.json")
    [h] = [f for f in healthy["findings"] if f["check"] == HANDOFF]
    print("off:", h["outcome"], h["summary"])
    assert code == 0 and h["outcome"] == "passed", _not_passed(healthy)
    assert not [e for e in _events(folder) if e["event"] != "installed"], _events(folder)

    (folder / "mode").write_text("zero-layer")
    code, faulty = _check(dep, tmp_path / "zero-layer.json")
    assert [e for e in _events(folder) if e["event"] == "zeroed"], "the hook zeroed nothing: the fault was not staged"
    [f] = [f for f in faulty["findings"] if f["check"] == HANDOFF]
    print("zero-layer:", f["outcome"], f["summary"])
    assert code == 1 and f["outcome"] == "failed", _not_passed(faulty)
    assert _not_passed(faulty) == [f"failed {HANDOFF}: {f['summary'][:400]}"], _not_passed(faulty)
    probes = {g["check"]: g["outcome"] for g in faulty["findings"] if g["gate"] == "probes"}
    assert all(o in ("passed", "info") for c, o in probes.items() if c != HANDOFF), probes

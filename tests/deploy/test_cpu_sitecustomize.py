"""The CPU server's sitecustomize pauses a not-idle scheduler instead of letting it spin.

Runs the real `kvgate/cpuserver/_stub/sitecustomize.py` in a fresh interpreter, as every server
process loads it, over a STUB of `sglang.srt.managers.scheduler` (a stand-in for sglang's module, not
sglang): a Scheduler whose `on_idle` returns at once and whose idleness the test sets.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from kvgate.cpuserver.env import STUB_DIR

# STUB of sglang's scheduler module: only the two methods the pause reads.
_STUB_SCHEDULER = """
class Scheduler:
    def __init__(self, idle):
        self.idle = idle
        self.calls = 0

    def on_idle(self):
        self.calls += 1

    def is_fully_idle(self):
        return self.idle
"""

_PROBE = """
import json, time
slept = []
time.sleep = slept.append
from sglang.srt.managers.scheduler import Scheduler
out = {}
for idle in (False, True):
    del slept[:]
    s = Scheduler(idle)
    s.on_idle()
    out[str(idle)] = {"calls": s.calls, "slept": list(slept)}
print(json.dumps(out))
"""


def _run(tmp_path: Path, **env: str) -> dict:
    pkg = tmp_path / "sglang" / "srt" / "managers"
    pkg.mkdir(parents=True, exist_ok=True)
    for d in (tmp_path / "sglang", tmp_path / "sglang" / "srt", pkg):
        (d / "__init__.py").touch()
    (pkg / "scheduler.py").write_text(_STUB_SCHEDULER)
    full = {k: v for k, v in os.environ.items() if k not in ("KVGATE_CPU_SPIN", "KVGATE_CPU_SERVER")}
    full.update(PYTHONPATH=os.pathsep.join([str(STUB_DIR), str(tmp_path)]), **env)
    res = subprocess.run([sys.executable, "-c", _PROBE], env=full, capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    return json.loads(res.stdout.splitlines()[-1])


def test_a_scheduler_that_waits_with_no_batch_pauses_and_an_idle_one_is_left_to_sglang(tmp_path: Path) -> None:
    out = _run(tmp_path, KVGATE_CPU_SERVER="1")
    assert out["False"] == {"calls": 1, "slept": [0.001]}  # sglang's on_idle ran, then the pause
    assert out["True"] == {"calls": 1, "slept": []}  # fully idle: sglang's own --sleep-on-idle decides


@pytest.mark.parametrize("env", [{"KVGATE_CPU_SERVER": "1", "KVGATE_CPU_SPIN": "1"}, {"KVGATE_CPU_SERVER": "0"}])
def test_the_spin_is_sglangs_own_when_asked_or_outside_a_cpu_server(tmp_path: Path, env: dict[str, str]) -> None:
    out = _run(tmp_path, **env)
    assert out["False"] == {"calls": 1, "slept": []}

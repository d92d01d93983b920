"""`kvgate sim up`: prints the URLs and a JSON line, serves, and leaves no process behind on SIGTERM/SIGINT."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from kvgate.deploy.supervisor import pid_alive
from tests.sim.conftest import sentinel_prompt

pytestmark = pytest.mark.slow


def _children(pid: int) -> list[int]:
    """Direct children of `pid` (the workers and the router run in their own sessions, still our children)."""
    out = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                out.append(int(entry.name))
    return out


def _default_sigint() -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _start(tmp_path: Path, *args: str) -> tuple[subprocess.Popen[str], dict]:
    proc = subprocess.Popen(
        [sys.executable, "-m", "kvgate.cli", "sim", "up", "--log-dir", str(tmp_path), *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        # Ctrl-C as a terminal delivers it: a shell starts background jobs with SIGINT ignored and the
        # child would inherit that (this test then hung in a CI run launched with `&`).
        preexec_fn=_default_sigint,
    )
    assert proc.stdout is not None
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            raise AssertionError(f"sim up exited: {proc.stderr.read() if proc.stderr else ''}")
        if line.startswith("{"):
            return proc, json.loads(line)
    raise AssertionError("no JSON line")


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_sim_up_serves_and_tears_down_without_orphans(tmp_path: Path, sig: signal.Signals) -> None:
    proc, urls = _start(tmp_path, "--release", "0.5.19", "--context-length", "4096", "--prefill-pool", "1024")
    try:
        assert set(urls) == {"router", "prefill", "decode"} and len(urls["prefill"]) == len(urls["decode"]) == 1
        kids = _children(proc.pid)
        assert len(kids) == 3 and all(pid_alive(k) for k in kids)
        # the README's drill: an over-pool prompt through the router shows another request's text under 200
        r = httpx.post(
            urls["router"] + "/generate",
            timeout=60,
            json={"text": sentinel_prompt("PLANTED-BY-A", 900), "sampling_params": {"max_new_tokens": 8}},
        )
        assert r.status_code == 200
        r = httpx.post(
            urls["router"] + "/generate",
            timeout=60,
            json={"text": "q" * 2000, "sampling_params": {"max_new_tokens": 200}},
        )
        assert r.status_code == 200 and "PLANTED-BY-A" in r.json()["text"]
    finally:
        proc.send_signal(sig)
        proc.wait(timeout=60)
    assert proc.returncode == 0
    deadline = time.monotonic() + 10
    while any(pid_alive(k) for k in kids) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not any(pid_alive(k) for k in kids)


def test_sim_up_rejects_an_unknown_release(tmp_path: Path) -> None:
    r = subprocess.run(
        [sys.executable, "-m", "kvgate.cli", "sim", "up", "--release", "0.4.0"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 2 and "0.5.19" in r.stderr


def test_kvgate_help_does_not_import_numpy_torch_or_fastapi() -> None:
    code = (
        "import sys; from kvgate.cli import app; "
        "assert not {'numpy', 'torch', 'fastapi'} & set(sys.modules), sorted(sys.modules)"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60, env={**os.environ})


def test_sim_up_killed_hard_leaves_no_orphans(tmp_path: Path) -> None:
    """SIGKILL gives `sim up` no chance to clean up: the children die with it (PR_SET_PDEATHSIG)."""
    proc, _ = _start(tmp_path, "--release", "0.5.22")
    kids = _children(proc.pid)
    assert len(kids) == 3
    proc.kill()
    proc.wait(timeout=30)
    deadline = time.monotonic() + 20
    while any(pid_alive(k) for k in kids) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not any(pid_alive(k) for k in kids)

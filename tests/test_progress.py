"""Progress lines: a step says when it starts and ends, and a long one keeps saying it is still running."""

from __future__ import annotations

import io
import time

from kvgate.progress import LineObserver


def test_a_long_step_keeps_saying_it_is_running() -> None:
    out = io.StringIO()
    obs = LineObserver(out, heartbeat_s=0.05)
    with obs.step("building the CPU environment"):
        time.sleep(0.3)
    lines = out.getvalue().splitlines()
    assert lines[0].endswith("building the CPU environment ...")
    assert lines[-1].split("] ", 1)[1].startswith("building the CPU environment done in ")
    still = [ln for ln in lines if "still building the CPU environment (" in ln]
    assert len(still) >= 2, lines  # about every heartbeat, not once


def test_a_short_step_is_two_lines() -> None:
    out = io.StringIO()
    with LineObserver(out, heartbeat_s=5.0).step("reading"):
        pass
    assert len(out.getvalue().splitlines()) == 2

"""Progress lines: a step says when it starts and ends, and a long one keeps saying it is still running."""

from __future__ import annotations

import io
import time

from kvgate.output.progress import LineObserver


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


def test_the_step_recorder_keeps_each_step_bounded_and_redacted() -> None:
    """Every step reaches the inner observer; the recorder keeps description, start and duration, at
    most `limit` of them (the rest counted), with a secret in a description redacted."""
    from kvgate.output import redact
    from kvgate.output.progress import StepRecorder

    out = io.StringIO()
    rec = StepRecorder(LineObserver(out, heartbeat_s=60), limit=3)
    with redact.scope():
        redact.register("hunter2secret")
        for i in range(5):
            with rec.step(f"step {i} http://u:hunter2secret@host:1/x"):
                pass
    assert [s["step"] for s in rec.steps][0].startswith("step 0") and len(rec.steps) == 3 and rec.dropped == 2
    assert all("hunter2secret" not in str(s) for s in rec.steps)
    assert all(isinstance(s["seconds"], float) and s["seconds"] >= 0 for s in rec.steps)
    assert out.getvalue().count("step ") >= 5  # the inner observer saw every step
    try:
        with rec.step("a step that raises"):
            raise ValueError("boom")
    except ValueError:
        pass
    assert rec.dropped == 3  # recorded (here: counted) even when the step raised

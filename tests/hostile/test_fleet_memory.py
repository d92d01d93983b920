"""Bounded memory for the whole read (issue 40, class 7).

Each answer was capped at 16 MiB, but nothing bounded the whole read: every worker's parsed
server_info was kept whole to the end of the run, and every answer in flight was buffered at once,
so a router listing many workers that answer near the cap chose kvgate's memory. Now the reader keeps
only the facts the gates judge (kvgate/compact.py) and at most about `wideread.INFLIGHT_BYTES` of
answers in flight. Here a fleet of listed workers (one process, real sockets: tests/assets/bulk_fleet.py)
each answers a server_info padded to near the cap, and `kvgate check` runs as a child process whose
peak RSS (its own `ru_maxrss`, from wait4) must stay under PEAK_RSS. Memory is asserted, never time.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from kvgate.defaults import METADATA_BODY_CAP
from kvgate.exitcodes import ExitStatus

#: the stated bound on a whole check's peak RSS, whatever the fleet answers
PEAK_RSS = 1 << 30
#: a server_info this close to the cap (its JSON around the padding takes the rest)
NEAR_CAP = METADATA_BODY_CAP - 80_000


def peak_rss_of_check(workers: int, pad: int) -> tuple[int, int, str]:
    """(exit status, peak RSS in bytes, stderr tail) of `kvgate check --no-probes` over a bulk fleet."""
    host = subprocess.Popen(
        [sys.executable, "-m", "tests.assets.bulk_fleet", "--workers", str(workers), "--pad", str(pad)],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert host.stdout is not None
        port = int(host.stdout.readline())
        argv = [
            str(Path(sys.executable).with_name("kvgate")),
            "check",
            "--quiet",
            "--router-url",
            f"http://127.0.0.1:{port}",
            "--no-probes",
            "--trust-version",
            "--deferred-release",
            "--timeout",
            "120",
            "--read-deadline",
            "3000",
            "--format",
            "json",
            "--output",
            os.devnull,
        ]
        child = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        assert child.stderr is not None
        err = child.stderr.read()  # read before waiting: a full pipe must not stall the child
        _, status, usage = os.wait4(child.pid, 0)
        child.returncode = os.waitstatus_to_exitcode(status)
        return child.returncode, usage.ru_maxrss * 1024, err.decode(errors="replace")[-2000:]
    finally:
        host.terminate()
        host.wait(timeout=30)


@pytest.mark.slow
def test_a_fleet_of_1024_near_cap_answers_stays_under_the_stated_peak_rss() -> None:
    code, rss, err = peak_rss_of_check(1024, NEAR_CAP)
    assert code in (ExitStatus.PASSED, ExitStatus.GATE_FAILED, ExitStatus.INCONCLUSIVE), (code, err)
    assert rss < PEAK_RSS, f"peak RSS {rss / (1 << 20):.0f} MiB over {PEAK_RSS >> 20} MiB"


def test_a_small_fleet_of_near_cap_answers_holds_no_answer_past_its_turn() -> None:
    """The same bound on 32 near-cap workers: more than the in-flight budget's worth (32 x 16 MiB is
    512 MiB) in every read, so whole documents or bodies kept would show."""
    code, rss, err = peak_rss_of_check(32, NEAR_CAP)
    assert code == ExitStatus.PASSED, (code, err)
    assert rss < 512 << 20, f"peak RSS {rss / (1 << 20):.0f} MiB"

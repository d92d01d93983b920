"""How the real tier is cut into units of work for `pytest -n 2` (tests/conftest.py's scheduler).

Every test of one real pair (the session-scoped, parametrized `real_pair`) is one unit, so one worker
runs them all in collection order and starts that pair once; the tier's tests that start pairs of their
own are a unit per file (a module-scoped pair stays on one worker). The two workers take the units, the
costliest first, the rest of the suite queued behind them, so both workers run real pairs from the start
and the suite's many short tests fill the end: no worker runs the tier alone while the other idles
(issue 44). No heavy imports: the xdist controller, which collects nothing, loads this.
"""

from __future__ import annotations

import re

REAL = "tests/real/"
#: A pair's id as conftest.PairSpec.id writes it: release-pool-mode-context-model.
PAIR_ID = re.compile(r"\[(\d+\.\d+\.\d+-(?:short|healthy)-(?:ids|text)-\d+k-[a-z0-9]+)\]$")
#: Units the suite must keep whole besides the pairs: the binary's tests (one build of dist/kvgate).
WHOLE_FILES = ("tests/test_binary.py",)
#: The tier's files that share one pair of their own (conftest's `decode_fault_pair`): one unit, one start.
FAULT_FILES = ("tests/real/test_handoff_fault_real.py", "tests/real/test_isolation_fault_real.py")
FAULT_UNIT = f"{REAL}decode faults"
#: Rough seconds, only to order the units (longest first); measured figures are in tests/real/README.md.
PAIR_START_S = 120.0
REAL_TEST_S = 60.0
OWN_PAIR_TEST_S = 120.0
#: Tests outside the tier that take minutes (real-code probes in the release's environment): queued
#: right after the tier's units, so none of them is left to run alone at the end.
SLOW_FILES = (
    "tests/backport/test_done_when.py",
    "tests/backport/test_lifetime_probe.py",
    "tests/backport/test_probe.py",
    "tests/test_binary.py",
)
SLOW_TEST_S = 30.0
#: In the run's temporary folder (the one the xdist workers' folders are in): one line per real pair
#: started, so a pair started twice in one run fails its second start, and the summary lists them.
STARTS_LOG = "real-pair-starts.log"


#: Whether the tier is cut into a unit per pair (both workers run real pairs) or kept one unit on one
#: worker. Kept whole for now: split, the `-k 0.5.22` piece took the same wall time (903 s against 905 s
#: on a loaded host) with every test about 1.67x slower beside a second real pair, and the tier's timing
#: probes are the suite's load-sensitive verdicts. Turn on once a whole run shows the idle tail
#: (pytest's summary prints it) is worth more than that contention.
SPLIT_REAL_TIER = False


def unit_of(nodeid: str) -> str:
    """The unit of work a test belongs to: its pair's, its file's (the tier's other tests, WHOLE_FILES),
    or its own; the whole tier one unit while SPLIT_REAL_TIER is off."""
    if nodeid.startswith(REAL):
        if not SPLIT_REAL_TIER:
            return REAL
        pair = PAIR_ID.search(nodeid)
        if pair:
            return f"{REAL}pair {pair.group(1)}"
        return FAULT_UNIT if nodeid.startswith(FAULT_FILES) else nodeid.split("::", 1)[0]
    return next((f for f in WHOLE_FILES if nodeid.startswith(f)), nodeid)


def cost_s(unit: str, tests: int) -> float:
    """Estimated seconds of a unit of `tests` tests, to start the longest first; 0 for a unit that is
    neither real nor known slow (those keep xdist's order)."""
    if unit == REAL:
        return OWN_PAIR_TEST_S * tests
    if unit.startswith(f"{REAL}pair "):
        return PAIR_START_S + REAL_TEST_S * tests
    if unit.startswith(REAL):
        return OWN_PAIR_TEST_S * tests
    if unit.startswith(SLOW_FILES):
        return SLOW_TEST_S * tests
    return 0.0

"""How the real tier is cut into units of work for `pytest -n 2` (tests/conftest.py's scheduler).

The tier's smallest whole parts (pieces) are the tests of one real pair (the session-scoped,
parametrized `real_pair`: one worker runs them in collection order and starts that pair once), the two
fault files (one shared pair) and each file of tests that start pairs of their own (a module-scoped
pair stays on one worker). The pieces are dealt into REAL_LANES lanes of about equal measured seconds
(one lane: the whole tier); each lane is one unit, the lanes queued first, so the tier starts at once and
the suite's many short tests fill the end (issue 44). No heavy imports: the xdist controller, which
collects nothing, loads this.
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


#: How many units of work (lanes) the tier is cut into: each lane a set of whole pieces (a pair's tests,
#: the fault files, a file of tests with pairs of their own), balanced by MEASURED_S and queued first.
#: One: the whole tier on one worker while the other runs the rest. Two lanes on three workers
#: (`-n 3`) were measured in a quiet whole run (stop 54, tests/real/README.md "Two lanes, three
#: workers"): 4,080 s of pytest against 4,021 s, the machine 91% busy instead of 71% and 127 CPU
#: minutes instead of 97.5 (pair starts 141-163 s instead of 61-158), and a simulator probe made
#: inconclusive by the load: the run is CPU-bound, and more at once only costs more.
REAL_LANES = 1
#: Seconds each piece of the tier took in a quiet whole run (stop 53, ba68b2c, tests/real/README.md),
#: only to balance the lanes; a piece not listed is estimated by cost_s.
MEASURED_S = {
    "pair 0.5.22-healthy-ids-8k-qwen2": 537,
    "test_dp_real.py": 298,
    "pair 0.5.23-healthy-text-4k-llama": 273,
    "pair 0.5.22-short-text-8k-llama": 263,
    "pair 0.5.20-healthy-ids-4k-llama": 242,
    "test_cli_real.py": 235,
    "decode faults": 227,
    "pair 0.5.21-short-ids-8k-llama": 199,
    "pair 0.5.20-short-text-8k-llama": 192,
    "pair 0.5.23-short-ids-8k-llama": 190,
    "pair 0.5.21-healthy-text-4k-qwen2": 166,
    "test_backport_real.py": 159,
    "pair 0.5.19-healthy-text-8k-llama": 154,
    "pair 0.5.19-short-ids-8k-qwen2": 125,
    "test_readme_real.py": 111,
    "pair 0.5.22-healthy-text-4k-qwen2": 98,
    "pair 0.5.23-healthy-text-4k-qwen2": 96,
    "test_checksum.py": 71,
}


def piece_of(nodeid: str) -> str:
    """The smallest part of the tier one worker must run whole: the tests of one pair (it starts once),
    the fault files (they share one pair), or one file (a module-scoped pair stays whole)."""
    pair = PAIR_ID.search(nodeid)
    if pair:
        return f"{REAL}pair {pair.group(1)}"
    return FAULT_UNIT if nodeid.startswith(FAULT_FILES) else nodeid.split("::", 1)[0]


def piece_cost_s(piece: str, tests: int) -> float:
    """A piece's seconds: measured where MEASURED_S has it, else estimated."""
    measured = MEASURED_S.get(piece.removeprefix(REAL))
    return float(measured) if measured is not None else cost_s(piece, tests)


def lanes(collection: list[str], count: int | None = None) -> dict[str, str]:
    """Each real piece of `collection` mapped to its lane's unit name: the costliest piece first onto the
    lane with the fewest seconds so far (longest-processing-time first), ties to the lower lane."""
    count = REAL_LANES if count is None else count
    tests: dict[str, int] = {}
    for nodeid in collection:
        if nodeid.startswith(REAL):
            piece = piece_of(nodeid)
            tests[piece] = tests.get(piece, 0) + 1
    if count <= 1:
        return {piece: REAL for piece in tests}
    load = [0.0] * count
    out: dict[str, str] = {}
    for piece in sorted(tests, key=lambda p: (-piece_cost_s(p, tests[p]), p)):
        lane = min(range(count), key=lambda i: (load[i], i))
        load[lane] += piece_cost_s(piece, tests[piece])
        out[piece] = f"{REAL}lane {lane}"
    return out


def grouped(nodeids: list[str]) -> list[str]:
    """`nodeids` with each piece's tests together, pieces in order of first appearance, each piece's tests
    in their given order: a lane runs a pair's tests back to back whatever order pytest collected."""
    order: dict[str, list[str]] = {}
    for nodeid in nodeids:
        order.setdefault(piece_of(nodeid) if nodeid.startswith(REAL) else nodeid, []).append(nodeid)
    return [nodeid for group in order.values() for nodeid in group]


def unit_of(nodeid: str, lane_of: dict[str, str] | None = None) -> str:
    """The unit of work a test belongs to: its piece's lane (`lane_of`, from `lanes`; the whole tier one
    unit without it), a file of WHOLE_FILES, or the test itself."""
    if nodeid.startswith(REAL):
        return (lane_of or {}).get(piece_of(nodeid), REAL)
    return next((f for f in WHOLE_FILES if nodeid.startswith(f)), nodeid)


def cost_s(unit: str, tests: int) -> float:
    """Estimated seconds of a unit of `tests` tests, to start the longest first; 0 for a unit that is
    neither real nor known slow (those keep xdist's order)."""
    if unit == REAL or unit.startswith(f"{REAL}lane "):
        return OWN_PAIR_TEST_S * tests
    if unit.startswith(f"{REAL}pair "):
        return PAIR_START_S + REAL_TEST_S * tests
    if unit.startswith(REAL):
        return OWN_PAIR_TEST_S * tests
    if unit.startswith(SLOW_FILES):
        return SLOW_TEST_S * tests
    return 0.0

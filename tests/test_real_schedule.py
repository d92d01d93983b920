"""The suite's xdist scheduler (tests/conftest.py, tests/real/schedule.py) driven as xdist drives it, workers
taking units as they finish tests: every real pair's tests land on one worker (the pair starts once); at
the default one lane the whole tier runs on one worker that starts with it; cut into two lanes (three
workers) two workers start on the lanes, the third on the rest, and the lanes are balanced."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from tests.conftest import pytest_xdist_make_scheduler
from tests.real import schedule
from tests.real.conftest import SPECS
from tests.real.schedule import piece_of, unit_of

PAIR_TESTS = ("test_backport_real.py::test_race", "test_differential.py::test_sim", "test_verdicts.py::test_check")
OWN_PAIRS = ("test_dp_real.py::test_dp", "test_cli_real.py::test_drill", "test_cli_real.py::test_up")
FAULTS = ("test_handoff_fault_real.py::test_h", "test_isolation_fault_real.py::test_i")
README_CMD = "tests/real/test_readme_real.py::test_cmd[drill 0.5.22]"


SENT: list[list[int]] = []  # each unit as the scheduler handed it out, in that order


class Worker:
    def __init__(self, name: str) -> None:
        self.name, self.queue, self.shutting_down = name, list[int](), False
        self.gateway = SimpleNamespace(id=name)

    def send_runtest_some(self, indexes: list[int]) -> None:
        SENT.append(list(indexes))
        self.queue += indexes

    def shutdown(self) -> None:
        self.shutting_down = True


def _collection() -> list[str]:
    real = [f"tests/real/{t}[{s.id}]" for t in PAIR_TESTS for s in SPECS]
    real += [f"tests/real/{t}" for t in OWN_PAIRS + FAULTS] + [README_CMD]
    rest = [f"tests/test_a{i:03}.py::test_{i}" for i in range(300)]
    rest += ["tests/test_binary.py::test_one", "tests/test_binary.py::test_two"]
    rest += [f"tests/test_z{i:03}.py::test_{i}" for i in range(300)]
    return sorted(real + rest)  # pytest collects files in path order; pairs interleave across files here


def _run(collection: list[str], workers: int = 3) -> list[tuple[str, str]]:
    """(worker, nodeid) in the order each ran, each worker running one test per step."""
    config = SimpleNamespace(getvalue=lambda name: [f"{workers}*popen"], option=SimpleNamespace(loadscopereorder=True))
    sched: Any = pytest_xdist_make_scheduler(config, None)  # type: ignore[arg-type]
    SENT.clear()
    nodes = [Worker(f"gw{i}") for i in range(workers)]
    for w in nodes:
        sched.add_node(w)
        sched.add_node_collection(w, collection)
    sched.schedule()
    ran: list[tuple[str, str]] = []
    while any(w.queue for w in nodes):
        for w in nodes:
            if w.queue:
                index = w.queue.pop(0)
                ran.append((w.name, collection[index]))
                sched.mark_test_complete(w, index)
    assert not sched.workqueue and len(ran) == len(collection)
    return ran


def _real(nodeid: str) -> bool:
    return nodeid.startswith("tests/real/")


@pytest.fixture
def two_lanes(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(schedule, "REAL_LANES", 2)


@pytest.mark.usefixtures("two_lanes")
def test_two_workers_start_on_the_tier_and_every_piece_stays_on_one() -> None:
    """Three workers: two run the tier's two lanes from their first test, the third starts on the rest of
    the suite; every pair's tests, the fault files and each own-pair file land on one worker."""
    ran = _run(_collection())
    where: dict[str, set[str]] = {}
    for worker, nodeid in ran:
        if _real(nodeid):
            where.setdefault(piece_of(nodeid), set()).add(worker)
    assert len(where) == len(SPECS) + len(OWN_PAIRS) - 1 + 2, sorted(where)  # cli_real is one file
    assert all(len(w) == 1 for w in where.values()), where
    tier = set().union(*where.values())
    assert len(tier) == 2, tier
    firsts = {w: next(n for wn, n in ran if wn == w) for w in ("gw0", "gw1", "gw2")}
    assert {w for w, n in firsts.items() if _real(n)} == tier, firsts


@pytest.mark.usefixtures("two_lanes")
def test_a_pairs_tests_run_together_in_collection_order_and_the_lanes_go_first() -> None:
    collection = _collection()
    ran = _run(collection)
    for worker in ("gw0", "gw1", "gw2"):
        mine = [n for w, n in ran if w == worker]
        pieces = [piece_of(n) for n in mine if _real(n)]
        runs = [p for i, p in enumerate(pieces) if i == 0 or pieces[i - 1] != p]
        assert len(runs) == len(set(runs)), f"{worker} left a piece and came back: {runs}"
        for piece in set(pieces):
            assert [n for n in mine if piece_of(n) == piece] == [n for n in collection if piece_of(n) == piece]
    # The two lanes are the first two units handed out: the short tests fill the end.
    real = [_real(collection[unit[0]]) for unit in SENT]
    assert real[:2] == [True, True] and sum(real) == 2, real


def test_the_lanes_are_balanced_by_the_measured_seconds() -> None:
    """Longest-first dealing: the lanes' seconds differ by no more than the largest piece's, every piece
    is in exactly one lane, and a piece of the tier never shares a lane's unit with another file's tests."""
    collection = [n for n in _collection() if _real(n)]
    lane_of = schedule.lanes(collection, 2)
    pieces = {piece_of(n) for n in collection}
    assert set(lane_of) == pieces and set(lane_of.values()) == {"tests/real/lane 0", "tests/real/lane 1"}
    counts = {p: sum(piece_of(n) == p for n in collection) for p in pieces}
    seconds = {lane: 0.0 for lane in set(lane_of.values())}
    for piece, lane in lane_of.items():
        seconds[lane] += schedule.piece_cost_s(piece, counts[piece])
    largest = max(schedule.piece_cost_s(p, counts[p]) for p in pieces)
    assert abs(seconds["tests/real/lane 0"] - seconds["tests/real/lane 1"]) <= largest, seconds
    assert unit_of("tests/test_a000.py::test_0", lane_of) == "tests/test_a000.py::test_0"


def test_one_lane_keeps_the_whole_tier_on_one_worker() -> None:
    """The default (REAL_LANES 1, `-n 2`): every real test on one worker, which starts with the tier and
    runs each piece's tests back to back; the other worker takes none of it."""
    assert schedule.REAL_LANES == 1
    collection = _collection()
    ran = _run(collection, workers=2)
    real = {w for w, n in ran if _real(n)}
    assert len(real) == 1, real
    (worker,) = real
    assert _real(next(n for w, n in ran if w == worker))
    pieces = [piece_of(n) for w, n in ran if _real(n)]
    runs = [p for i, p in enumerate(pieces) if i == 0 or pieces[i - 1] != p]
    assert len(runs) == len(set(runs)), runs


def test_the_files_sharing_the_fault_pair_are_one_piece() -> None:
    """The two fault tests land on one worker: they share one started pair."""
    assert {piece_of(f"{f}::test_x") for f in schedule.FAULT_FILES} == {schedule.FAULT_UNIT}
    assert piece_of("tests/real/test_dp_real.py::test_dp") != schedule.FAULT_UNIT


def test_every_measured_piece_is_a_piece_of_the_tier() -> None:
    """MEASURED_S names pairs of SPECS and files that exist: a renamed pair or file cannot leave a stale
    figure balancing nothing."""
    ids = {s.id for s in SPECS}
    root = Path(__file__).resolve().parent / "real"
    for piece in schedule.MEASURED_S:
        if piece.startswith("pair "):
            assert piece.removeprefix("pair ") in ids, piece
        elif piece != schedule.FAULT_UNIT.removeprefix(schedule.REAL):
            assert (root / piece).is_file(), piece

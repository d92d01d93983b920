"""The suite's xdist scheduler (tests/conftest.py, tests/real/schedule.py) driven as xdist drives it, two
workers taking units as they finish tests: every real pair's tests land on one worker (the pair starts
once), both workers start on real pairs, and no test outside the tier is handed out before the tier's
last unit is."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from tests.conftest import pytest_xdist_make_scheduler
from tests.real import schedule
from tests.real.conftest import SPECS
from tests.real.schedule import PAIR_ID, unit_of

PAIR_TESTS = ("test_backport_real.py::test_race", "test_differential.py::test_sim", "test_verdicts.py::test_check")
OWN_PAIRS = ("test_dp_real.py::test_dp", "test_cli_real.py::test_drill", "test_cli_real.py::test_up")


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
    real += [f"tests/real/{t}" for t in OWN_PAIRS] + ["tests/real/test_readme_real.py::test_cmd[drill 0.5.22]"]
    rest = [f"tests/test_a{i:03}.py::test_{i}" for i in range(300)]
    rest += ["tests/test_binary.py::test_one", "tests/test_binary.py::test_two"]
    rest += [f"tests/test_z{i:03}.py::test_{i}" for i in range(300)]
    return sorted(real + rest)  # pytest collects files in path order; pairs interleave across files here


def _run(collection: list[str]) -> list[tuple[str, str]]:
    """(worker, nodeid) in the order each ran, each worker running one test per step."""
    config = SimpleNamespace(getvalue=lambda name: ["2*popen"], option=SimpleNamespace(loadscopereorder=True))
    sched: Any = pytest_xdist_make_scheduler(config, None)  # type: ignore[arg-type]
    SENT.clear()
    workers = [Worker("gw0"), Worker("gw1")]
    for w in workers:
        sched.add_node(w)
        sched.add_node_collection(w, collection)
    sched.schedule()
    ran: list[tuple[str, str]] = []
    while any(w.queue for w in workers):
        for w in workers:
            if w.queue:
                index = w.queue.pop(0)
                ran.append((w.name, collection[index]))
                sched.mark_test_complete(w, index)
    assert not sched.workqueue and len(ran) == len(collection)
    return ran


@pytest.fixture
def split(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(schedule, "SPLIT_REAL_TIER", True)


def test_the_tier_kept_whole_runs_on_one_worker_first() -> None:
    """SPLIT_REAL_TIER off (the default): every real test on one worker, which starts with the tier, and
    the other worker takes none of it."""
    assert not schedule.SPLIT_REAL_TIER
    ran = _run(_collection())
    real = {w for w, n in ran if n.startswith("tests/real/")}
    assert len(real) == 1, real
    (worker,) = real
    assert next(n for w, n in ran if w == worker).startswith("tests/real/")


@pytest.mark.usefixtures("split")
def test_each_pair_runs_on_one_worker_and_both_start_on_real_pairs() -> None:
    ran = _run(_collection())
    where: dict[str, set[str]] = {}
    for worker, nodeid in ran:
        if PAIR_ID.search(nodeid):
            where.setdefault(unit_of(nodeid), set()).add(worker)
    assert len(where) == len(SPECS) and all(len(w) == 1 for w in where.values()), where
    assert set().union(*where.values()) == {"gw0", "gw1"}  # the tier is split, not left to one worker
    firsts = {w: next(n for wn, n in ran if wn == w) for w in ("gw0", "gw1")}
    assert all(PAIR_ID.search(n) for n in firsts.values()), firsts


@pytest.mark.usefixtures("split")
def test_a_pairs_tests_run_together_in_collection_order_and_the_tier_goes_first() -> None:
    collection = _collection()
    ran = _run(collection)
    for worker in ("gw0", "gw1"):
        mine = [n for w, n in ran if w == worker]
        pairs = [unit_of(n) for n in mine if PAIR_ID.search(n)]
        runs = [p for i, p in enumerate(pairs) if i == 0 or pairs[i - 1] != p]
        assert len(runs) == len(set(runs)), f"{worker} left a pair and came back: {runs}"
        for unit in set(pairs):
            tests = [n for n in mine if unit_of(n) == unit]
            assert tests == [n for n in collection if unit_of(n) == unit]
    # Every unit of the tier is handed out before any other test: the short tests fill the end.
    real = [collection[unit[0]].startswith("tests/real/") for unit in SENT]
    assert real == sorted(real, reverse=True) and sum(real) == len(SPECS) + 3, real


def test_the_files_sharing_the_fault_pair_are_one_unit(monkeypatch: pytest.MonkeyPatch) -> None:
    """Split per pair, the two fault tests still land on one worker: they share one started pair."""
    monkeypatch.setattr(schedule, "SPLIT_REAL_TIER", True)
    units = {unit_of(f"{f}::test_x") for f in schedule.FAULT_FILES}
    assert units == {schedule.FAULT_UNIT}
    assert unit_of("tests/real/test_dp_real.py::test_dp") != schedule.FAULT_UNIT

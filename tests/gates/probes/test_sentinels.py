"""Sentinels: fresh, dense, found whole or in fragments, attributed."""

from __future__ import annotations

from kvgate.gates.probes.sentinels import ANY_SENTINEL, ByteCodec, new_sentinel, plant_ids, scan
from kvgate.sim import tokenizer as sim_tokenizer


def test_fresh_per_call() -> None:
    cores = {new_sentinel("x").core for _ in range(200)}
    assert len(cores) == 200 and all(ANY_SENTINEL.fullmatch(c) for c in cores)


def test_dense_plant_round_trips_through_the_simulator_tokenizer() -> None:
    s = new_sentinel("plant")
    ids = plant_ids(ByteCodec(), s, 1000)
    assert len(ids) == 1000
    text = sim_tokenizer.decode(ids)
    page = 16
    # at least one whole sentinel per 2 pages, a fragment in every page
    for i in range(0, 1000 - page, page):
        assert s.found_in(sim_tokenizer.decode(ids[i:i + page]))


def test_scan_attributes_foreign_and_ignores_own() -> None:
    a, b = new_sentinel("plant (100 tokens)"), new_sentinel("over (200 tokens)")
    assert scan("over", b, f"{b.text}\n{b.text}", [a, b]) == []
    hits = scan("over (200 tokens)", b, f"xx{a.text[3:12]}yy", [a, b])  # a fragment of a
    assert [(h.source, h.victim) for h in hits] == [("plant (100 tokens)", "over (200 tokens)")]


def test_scan_flags_sentinels_of_earlier_runs() -> None:
    old = new_sentinel("old run")
    mine = new_sentinel("mine")
    hits = scan("mine", mine, old.text, [mine])
    assert len(hits) == 1 and "earlier kvgate run" in hits[0].source

"""What is kept of a worker's answers (kvgate/reading/compact.py): the facts the gates judge, digests for the rest."""

from __future__ import annotations

from kvgate.reading.compact import MAX_RANKS_KEPT, RANK_COUNT, REST, compact_info, compact_model_info, compact_models
from kvgate.reading.fleetread import judged_facts
from kvgate.reading.node import NodeSpec, parse_node
from tests.assets import sglang_payloads as P

SPEC = NodeSpec("prefill", "http://127.0.0.1:1")


def reading(info: dict[str, object]):  # type: ignore[no-untyped-def]
    return parse_node(SPEC, "/server_info", compact_info(info), compact_models(P.v1_models()), None)


def test_a_healthy_answer_reads_as_it_did_whole() -> None:
    info = P.server_info("0.5.22", mode="prefill", pool=2_040_000, rank_pools=[2_040_000] * 4)
    whole = parse_node(SPEC, "/server_info", info, P.v1_models(), P.model_info("0.5.22", "prefill"))
    kept = parse_node(
        SPEC,
        "/server_info",
        compact_info(info),
        compact_models(P.v1_models()),
        compact_model_info(P.model_info("0.5.22", "prefill")),
    )
    assert judged_facts(kept) == {**judged_facts(whole), f"flag {RANK_COUNT}": 4}
    assert not any(isinstance(v, str) and v.startswith("kvgate:digest") for v in kept.server_info.values())


def test_a_large_value_is_a_digest_that_still_shows_a_change() -> None:
    info = P.server_info("0.5.22", mode="prefill", pool=2_040_000)
    a = compact_info({**info, "padding": "x" * 1_000_000})
    b = compact_info({**info, "padding": "x" * 999_999 + "y"})
    assert a["padding"].startswith("kvgate:digest") and len(a["padding"]) < 100
    assert a["padding"] != b["padding"]
    assert a["max_total_num_tokens"] == 2_040_000  # what a gate reads is kept


def test_many_keys_fold_into_one_digest_and_a_server_cannot_supply_our_names() -> None:
    info = P.server_info("0.5.22", mode="prefill", pool=2_040_000)
    many = {**info, **{f"k{i:06d}": "v" * 100 for i in range(100_000)}, RANK_COUNT: 1, REST: "forged"}
    kept = compact_info(many)
    assert len(kept) < 2_000 and kept[REST].startswith("kvgate:digest of")
    assert kept[RANK_COUNT] == 1  # the count of internal_states sent, not the server's word


def test_more_ranks_than_one_server_has_is_a_field_problem_not_memory() -> None:
    info = P.server_info("0.5.22", mode="prefill", pool=2_040_000)
    info["internal_states"] = info["internal_states"] * (MAX_RANKS_KEPT + 10)
    r = reading(info)
    assert len(r.ranks) == MAX_RANKS_KEPT and r.rank_entries == MAX_RANKS_KEPT + 10
    assert r.problem("internal_states") is not None

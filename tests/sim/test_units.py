"""Unit tests of the simulator's parts: tokenizer, KV pool, toy model, limits, per-release table."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from kvgate.sim import tokenizer, transfer
from kvgate.sim.config import WorkerConfig, env_bool
from kvgate.sim.engine import BaseEngine
from kvgate.sim.kvpool import KVPool, PoolExhausted
from kvgate.sim.prefill import PrefillEngine
from kvgate.sim.releases import KvgateBackport, SimRelease, get_release
from kvgate.sim.request import RequestError, SimReq
from kvgate.sim.toymodel import Context, attend
from kvgate.upstream.releases import DEFERRED_RELEASE_DEFAULT, RELEASES


def test_tokenizer_round_trips_text_and_ids() -> None:
    text = "SENTINEL-\u00e9\u4e2d-42\nline two"
    ids = tokenizer.encode(text)
    assert all(0 <= i < 256 for i in ids)
    assert tokenizer.decode(ids) == text
    assert tokenizer.encode_tensor(text).tolist() == ids
    assert tokenizer.tensor_to_bytes(np.array(ids)) == text.encode()


def test_pool_allocates_lowest_first_and_never_clears_freed_pages() -> None:
    pool = KVPool(capacity_tokens=64, page_size=4)
    a = pool.alloc(3)
    assert a.tolist() == [0, 1, 2]
    pool.write_tokens(a, np.arange(1, 11))  # 10 tokens: 2 full pages + 2 slots of the third
    pool.free(a)
    b = pool.alloc(2)
    assert b.tolist() == [0, 1]
    assert pool.read_pages(b).tolist() == list(range(1, 9))  # stale content is still there
    with pytest.raises(PoolExhausted):
        pool.alloc(pool.num_pages)


def test_attend_reads_distinct_lines_and_skips_pad() -> None:
    pool = KVPool(capacity_tokens=256, page_size=8)
    pages = pool.alloc(pool.pages_for(64))
    text = "aa\naa\naa\nSECRET\naa\n"
    pool.write_tokens(pages, tokenizer.encode_tensor(text))
    assert attend(pool, pages, len(text)) == b"aa\nSECRET\n"
    # a pad token at slot 0 (SGLang's one-token placeholder) is not part of the text
    pool.write_tokens(pages[:1], np.zeros(1, dtype=np.int32))
    assert attend(pool, pages, len(text)) == b"a\naa\nSECRET\n"


def _generate(ctx: Context, n: int) -> list[int]:
    out: list[int] = []
    for _ in range(n):
        tok = ctx.next_token()
        assert tok is not None
        out.append(tok)
        ctx.feed(tok)
    return out


def test_toy_model_is_autoregressive_so_prefill_is_the_oracle() -> None:
    """Issue 39: the next token is a function of the context alone, so `X + y[:k]` gives `y[k]`."""
    for prompt in (b"hello\nworld\n", b"ab1\nab2\nab3\nab", b"x" * 40, b"\x00\x00q1\nq2\n\x00q"):
        y = _generate(Context(prompt), 24)
        for k in range(24):
            assert Context(prompt + bytes(y[:k])).next_token() == y[k], (prompt, k)
    # a whole-line prompt is echoed from its first distinct line
    assert bytes(_generate(Context(b"hello\nworld\n"), 8)) == b"hello\nwo"
    assert Context(b"").next_token() is None and Context(b"\n\n").next_token() is None


def _engine(version: str, context: int, pool: int) -> BaseEngine:
    cfg = WorkerConfig(mode="prefill", context_length=context, max_total_tokens=pool, page_size=1, emulate=version)
    return PrefillEngine(cfg, get_release(version))


def test_limits_follow_sglang_formula() -> None:
    eng = _engine("0.5.20", context=1_048_576, pool=681_280)
    assert eng.max_total_num_tokens == 681_280
    assert eng.max_req_input_len == min(1_048_576 - 1, 681_280 - 1) - 5 == 681_274


def test_tokenizer_stage_rejects_context_with_sglangs_message() -> None:
    eng = _engine("0.5.22", context=100, pool=1000)
    with pytest.raises(RequestError) as err:
        eng.tokenizer_stage(np.zeros(100, dtype=np.int32), None)
    assert err.value.abort.message == "The input (100 tokens) is longer than the model's context length (100 tokens)."
    assert err.value.abort.status_code == 400


def test_scheduler_stage_is_set_finish_with_abort() -> None:
    eng = _engine("0.5.19", context=4096, pool=100)
    req = SimReq(
        rid="r",
        input_ids=np.ones(94, dtype=np.int32),
        max_new_tokens=4,
        bootstrap_host="127.0.0.1",
        bootstrap_port=1,
        bootstrap_room=7,
        caller_tokens=94,
    )
    eng.scheduler_stage(req)  # 94 >= max_req_input_len (99 - 5)
    assert req.to_finish is not None
    assert req.to_finish.message == (
        "Input length (94 tokens) exceeds the maximum allowed length (94 tokens). "
        "Use a shorter input or enable --allow-auto-truncate."
    )
    assert req.input_ids.tolist() == [0]
    assert not req.finished()  # the bug's root: finished() reads finished_reason only
    ok = SimReq(
        rid="s",
        input_ids=np.ones(93, dtype=np.int32),
        max_new_tokens=4,
        bootstrap_host=None,
        bootstrap_port=None,
        bootstrap_room=8,
    )
    eng.scheduler_stage(ok)
    assert ok.to_finish is None and ok.input_ids.size == 93


def test_release_table() -> None:
    # one class per release kvgate knows (kvgate.upstream.releases.RELEASES is the one list)
    assert [get_release(v).version for v in RELEASES] == list(RELEASES)
    r19, r20, r21, r22, r23 = (get_release(v) for v in ("0.5.19", "0.5.20", "0.5.21", "0.5.22", "0.5.23"))
    assert not r19.retires_aborted_result_after_forward() and r20.retires_aborted_result_after_forward()
    assert not r20.admission_door_rejects(True, False) and r21.admission_door_rejects(True, False)
    assert not r21.admission_door_rejects(True, holds_resources=True)  # re-entry/preempted: not dropped
    assert (r19.deferred_release_default, r20.deferred_release_default, r21.deferred_release_default) == (
        False,
        False,
        True,
    )
    assert all(get_release(v).deferred_release_default is DEFERRED_RELEASE_DEFAULT[v] for v in RELEASES)
    assert not r20.has_kv_checksum_flag and r21.has_kv_checksum_flag
    assert not r22.has_decode_allocation_args and r23.has_decode_allocation_args
    assert r20.has_kvgate_backport and not r21.has_kvgate_backport
    assert not r19.has_ready_endpoint and r20.has_ready_endpoint
    assert "disaggregation_mode" in r22.internal_state_extra("prefill")
    assert "disaggregation_mode" not in r21.internal_state_extra("prefill")
    with pytest.raises(ValueError):
        get_release("0.5.18")


def test_env_bool_parsing(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("X_FLAG", "no")
    assert env_bool("X_FLAG", True) is False
    monkeypatch.setenv("X_FLAG", "Y")
    assert env_bool("X_FLAG", False) is True
    monkeypatch.delenv("X_FLAG")
    assert env_bool("X_FLAG", True) is True


def test_transfer_frames_over_a_real_socket() -> None:
    async def scenario() -> list[transfer.Message | None]:
        got: list[transfer.Message | None] = []
        done = asyncio.Event()

        async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            got.append(await transfer.recv(reader))
            got.append(await transfer.recv(reader))
            got.append(await transfer.recv(reader))
            done.set()

        server = await asyncio.start_server(handle, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        _, writer = await asyncio.open_connection("127.0.0.1", port)
        pages = np.array([5, 9])
        content = np.arange(8, dtype=np.int32)
        await transfer.send(writer, {"type": "kv", "room": 1, "count": 2}, transfer.pack_pages(pages, content))
        await transfer.send(writer, {"type": "done", "room": 1, "claimed_tokens": 1})
        writer.close()
        await done.wait()
        server.close()
        return got

    kv, done, eof = asyncio.run(scenario())
    assert kv is not None and kv.type == "kv"
    pages, content = transfer.unpack_pages(kv.payload, 2)
    assert pages.tolist() == [5, 9] and content.tolist() == list(range(8))
    assert done is not None and done.header["claimed_tokens"] == 1
    assert eof is None


def test_backport_emulation_only_on_old_releases() -> None:
    r = get_release("0.5.20", "kvgate-backport")
    assert r.version == "0.5.20" and r.admission_door_rejects(True, False) and r.deferred_release_default
    assert not r.acks_abort_after_drain() and not r.validates_transfer_coverage()
    assert get_release("0.5.19", "kvgate-backport-hardened").validates_transfer_coverage()
    assert get_release("0.5.19", "kvgate-backport").retires_aborted_result_after_forward()
    with pytest.raises(ValueError):
        get_release("0.5.22", "kvgate-backport")
    with pytest.raises(ValueError):
        get_release("0.5.20", "upstream")


def test_backport_emulation_states_every_behaviour_itself() -> None:
    # KvgateBackport is a SimRelease whose defaults are 0.5.19's: a behaviour it did not define (or copy
    # from its base) would silently be 0.5.19's on a 0.5.20 base.
    backport = get_release("0.5.20", "kvgate-backport")
    assert isinstance(backport, KvgateBackport)
    public = {name for name in vars(SimRelease) if not name.startswith("_")}
    missing = sorted(name for name in public if name not in vars(KvgateBackport) and name not in vars(backport))
    assert missing == []
    base = get_release("0.5.20")
    for mode in ("prefill", "decode"):
        assert backport.server_info_extra(mode) == base.server_info_extra(mode)
        assert backport.model_info_extra(mode) == base.model_info_extra(mode)
    assert backport.has_ready_endpoint and not get_release("0.5.19", "kvgate-backport").has_ready_endpoint

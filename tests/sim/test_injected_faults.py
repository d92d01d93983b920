"""The simulator's injected decode faults (kvgate/sim/faults.py) and its logprobs, over real sockets.

Each test starts a simulated deployment behind the real router (smg) and sends /generate requests:
alone a request is never hit; sent together, a fault shows as SGLang would show it.
"""

from __future__ import annotations

import secrets
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import pytest

from kvgate.sim import faults
from tests.sim.conftest import generate, state

pytestmark = pytest.mark.slow

LETTERS = "ABCDEFGHIJKLMNOPQRST"


def prompt(i: int) -> str:
    """A prompt whose toy-model answer starts with its own letter (distinct lines, distinct first byte)."""
    return (f"{LETTERS[i]}{secrets.token_hex(4)} load\n" * 4)[:64]


def body(text: str, **extra: Any) -> dict[str, Any]:
    return {"text": text, "sampling_params": {"max_new_tokens": 4, "temperature": 0.0}, **extra}


def together(url: str, texts: list[str]) -> list[httpx.Response]:
    with ThreadPoolExecutor(max_workers=len(texts)) as pool:
        return list(pool.map(lambda t: generate(url, body(t), timeout=60), texts))


def dep_with(deployment: Any, fault: str | None, **kw: Any) -> Any:
    env = {faults.ENV: fault} if fault else {}
    return deployment(emulate="0.5.22", context_length=8192, prefill_pool=10240, extra_env=env, **kw)


def test_logprobs_have_sglangs_shape_in_both_serving_modes(deployment: Any) -> None:
    for skip in (False, True):
        dep = deployment(emulate="0.5.21", context_length=8192, prefill_pool=10240, skip_tokenizer_init=skip)
        r = generate(dep.router_url, body("hello\nworld\n", return_logprob=True, top_logprobs_num=2))
        assert r.status_code == 200, r.text
        doc = r.json()
        meta = doc["meta_info"]
        assert doc["output_ids"] == [104, 101, 108, 108]  # "hell": the toy model echoes the first line
        assert ("text" in doc) is not skip
        # SGLang: per output position [logprob, token_id, text-or-null], best first
        assert [e[1] for e in meta["output_token_logprobs"]] == doc["output_ids"]
        tops = meta["output_top_logprobs"]
        assert len(tops) == 4 and all(len(t) == 2 for t in tops)
        assert all(
            t[0][1] == tok and t[0][0] > t[1][0] and t[0][2] is None
            for t, tok in zip(tops, doc["output_ids"], strict=True)
        )
        plain = generate(dep.router_url, body("hello\n")).json()["meta_info"]
        assert "output_top_logprobs" not in plain  # only when asked
        dep.stop()


def test_slot_collision_aborts_with_sglangs_message_under_load_only(deployment: Any) -> None:
    dep = dep_with(deployment, faults.META_SLOT_SHARED)
    alone = [generate(dep.router_url, body(prompt(i))) for i in range(3)]
    assert all(r.status_code == 200 for r in alone)
    res = together(dep.router_url, [prompt(i) for i in range(16)])
    bad = [r for r in res if r.status_code != 200]
    assert bad, [r.text for r in res]
    assert all(r.status_code == 500 and faults.ABORT_MESSAGE in r.text for r in bad)
    assert state(dep.decode_urls[0])["stats"]["fault_collisions"] >= len(bad)
    logs = "".join(p.read_text(errors="replace") for p in dep.log_dir.rglob("*") if p.is_file())
    assert "This indicates metadata buffer index collision." in logs


def test_unchecked_slot_collision_serves_another_requests_first_token(deployment: Any) -> None:
    dep = dep_with(deployment, faults.META_SLOT_SHARED_UNCHECKED)
    texts = [prompt(i) for i in range(16)]
    res = together(dep.router_url, texts)
    assert all(r.status_code == 200 for r in res), [r.text for r in res]
    firsts = [r.json()["output_ids"][0] for r in res]
    own = [ord(t[0]) for t in texts]
    wrong = [i for i, (f, o) in enumerate(zip(firsts, own, strict=True)) if f != o]
    assert wrong, firsts
    for i in wrong:
        assert firsts[i] in own  # another request's first token, silently
        assert res[i].json()["output_ids"][1:] == list(texts[i][1:4].encode())  # the rest is its own


def test_early_page_reuse_serves_another_requests_prompt(deployment: Any) -> None:
    dep = dep_with(deployment, faults.EARLY_PAGE_REUSE)
    texts = [prompt(i) for i in range(16)]
    res = together(dep.router_url, texts)
    answers = [r.json()["text"] for r in res]
    foreign = [(a, t) for a, t in zip(answers, texts, strict=True) if a != t[:4]]
    assert foreign, answers
    for a, own in foreign:
        # the tokens the decode computes from the reused pages are another prompt's (the first token may
        # still be its own: it comes from prefill's metadata, written before the late pages landed)
        assert any(a[1:] == t[1:4] for t in texts if t != own), (a, [t[:4] for t in texts])


def test_fault_switches_on_after_start_and_off_again(deployment: Any) -> None:
    dep = dep_with(deployment, None)
    texts = [prompt(i) for i in range(16)]
    assert all(r.status_code == 200 for r in together(dep.router_url, texts))
    url = dep.decode_urls[0]
    assert httpx.post(url + "/sim/fault", json={"fault": "no-such-fault"}, timeout=10).status_code == 400
    assert httpx.post(url + "/sim/fault", json={"fault": faults.META_SLOT_SHARED}, timeout=10).json() == {
        "fault": faults.META_SLOT_SHARED
    }
    assert any(r.status_code == 500 for r in together(dep.router_url, texts))
    httpx.post(url + "/sim/fault", json={"fault": None}, timeout=10)
    assert state(url)["injected_fault"] is None
    assert all(r.status_code == 200 for r in together(dep.router_url, texts))


def test_gradual_drift_answers_right_for_n_requests_then_drifts(deployment: Any) -> None:
    """Switched on at start (KVGATE_SIM_DRIFT_AFTER) and at run time (`after`), counted from the switch."""
    env = {faults.ENV: faults.GRADUAL_DRIFT, faults.DRIFT_ENV: "3"}
    dep = deployment(emulate="0.5.22", context_length=8192, prefill_pool=10240, extra_env=env)
    text = prompt(1)
    right = list(text[:4].encode())

    def ask() -> list[int]:
        r = httpx.post(dep.router_url + "/generate", json=body(text), timeout=30)
        assert r.status_code == 200, r.text
        ids: list[int] = r.json()["output_ids"]
        return ids

    assert [ask() for _ in range(3)] == [right] * 3
    url = dep.decode_urls[0]
    assert state(url)["drift_since"] is None
    drifted = ask()
    assert drifted[0] == right[0]  # the first token is prefill's
    # the first token decode computes drifts (and the answer goes on from it: it feeds back)
    assert drifted[1] == faults.drifted(right[1], 256) and drifted[1:] != right[1:]
    assert state(url)["drift_since"] is not None and state(url)["stats"]["drifted"] == 1
    # switched on again at run time with its own count: right twice, then drifting
    assert httpx.post(url + "/sim/fault", json={"fault": faults.GRADUAL_DRIFT, "after": 2}, timeout=10).json() == {
        "fault": faults.GRADUAL_DRIFT,
        "drift_after": 2,
    }
    assert state(url)["drift_since"] is None
    assert [ask() for _ in range(2)] == [right] * 2
    assert ask() != right
    bad = httpx.post(url + "/sim/fault", json={"fault": faults.GRADUAL_DRIFT, "after": -1}, timeout=10)
    assert bad.status_code == 400

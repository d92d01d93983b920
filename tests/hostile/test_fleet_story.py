"""A pass means the whole fleet was seen and agreed with itself (issue 29, the gate's half).

Cases 1-4 of the issue, rebuilt from its description: real loopback workers and routers answering
SGLang's and smg's shapes (tests/assets), the real CLI in-process, with the metadata-only
configuration a pipeline uses when probing is forbidden (`--no-probes --trust-version
--deferred-release`). Each used to exit 0; each now blocks and names what disagreed. Then a
property: over generated router listings and worker self-descriptions, exit 0 only when every routed
worker and rank was read and every view agrees.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from kvgate.cli import app
from kvgate.exitcodes import ExitStatus
from tests.assets import router_payloads as R
from tests.assets import sglang_payloads as P
from tests.conftest import PayloadServer, Route

runner = CliRunner()
BIG = 2_040_000
META_ONLY = ("--no-probes", "--trust-version", "--deferred-release")


def routes(mode: str, *, dp: int = 1, info: dict[str, Any] | None = None, context: int = 1_048_576) -> dict[str, Route]:
    doc = info if info is not None else P.server_info("0.5.22", mode=mode, pool=BIG, rank_pools=[BIG] * dp)
    return {
        "/server_info": Route(doc),
        "/v1/models": Route(P.v1_models(context)),
        "/model_info": Route(P.model_info("0.5.22", mode)),
    }


def decode_at_8k(payload_server: Callable[..., PayloadServer]) -> PayloadServer:
    """A decode of 0.5.22 whose every source says an 8,192-token context, its pool big."""
    info = P.server_info("0.5.22", mode="decode", pool=BIG, context=8_192)
    return payload_server(routes("decode", info=info, context=8_192))


def check(*args: str) -> tuple[int, dict[str, Any]]:
    res = runner.invoke(app, ["check", "--quiet", *META_ONLY, *args, "--format", "json"])
    assert res.stdout.startswith("{"), (res.exit_code, res.stdout, res.stderr)
    return res.exit_code, json.loads(res.stdout)


def of(doc: dict[str, Any], check_id: str) -> list[dict[str, Any]]:
    return [f for f in doc["findings"] if f"{f['gate']}.{f['check']}" == check_id]


def router(make: Callable[..., PayloadServer], *entries: dict[str, Any]) -> PayloadServer:
    return make({"/workers": Route(R.smg_workers(*entries)), "/readiness": Route({"status": "ready"})})


# --- case 1: a router entry that names two workers ----------------------------------------------


@pytest.mark.parametrize("given_urls", [True, False], ids=["with-worker-urls", "router-only"])
def test_case_1_an_entry_naming_two_workers_blocks(
    payload_server: Callable[..., PayloadServer], given_urls: bool
) -> None:
    p = payload_server(routes("prefill"))
    d = payload_server(routes("decode"))
    other = payload_server(routes("decode"))  # the worker the entry's url routes to; nobody gated it
    r = router(
        payload_server,
        R.smg_entry(p.url, "prefill", bootstrap_port=8998),
        R.smg_entry(f"{other.url}@0", "decode", dp_base_url=d.url, dp_rank=0, dp_size=1),
    )
    args = ["--router-url", r.url] + (["--prefill-url", p.url, "--decode-url", d.url] if given_urls else [])
    code, doc = check(*args)
    assert code in (ExitStatus.GATE_FAILED, ExitStatus.INCONCLUSIVE), code
    [ident] = of(doc, "fleet.router-identity")
    assert ident["outcome"] == "inconclusive" and ident["blocking"]
    assert other.url in ident["summary"] and d.url in ident["summary"]  # both views named
    if given_urls:  # the worker the router routes to was not given: it went ungated
        [member] = [f for f in of(doc, "fleet.router-membership") if f["outcome"] == "failed"]
        assert other.url in member["summary"]
    else:  # the URL the router routes to is the URL gated
        assert {n["url"] for n in doc["target"]["nodes"]} == {p.url, other.url}


def test_case_1_a_worker_listed_twice_under_two_spellings_blocks(payload_server: Callable[..., PayloadServer]) -> None:
    p = payload_server(routes("prefill"))
    d = payload_server(routes("decode"))
    r = router(
        payload_server,
        R.smg_entry(p.url, "prefill", bootstrap_port=8998),
        R.smg_entry(d.url, "decode"),
        R.smg_entry(d.url + "/", "decode"),
    )
    code, doc = check("--router-url", r.url)
    assert code == ExitStatus.INCONCLUSIVE
    [dup] = of(doc, "fleet.router-identity")
    assert "2 times" in dup["summary"] and dup["blocking"]


def test_case_1_one_worker_under_a_name_and_an_address_blocks(payload_server: Callable[..., PayloadServer]) -> None:
    """No spelling rule joins `localhost` and `127.0.0.1`; the worker's own answer does: one port, one
    launch time. Two workers that each say who they are pass."""

    def own(mode: str, port: int, started: float) -> dict[str, Route]:
        info = P.server_info("0.5.22", mode=mode, pool=BIG)
        info.update(port=port, startup_time=started)
        return routes(mode, info=info)

    p = payload_server(own("prefill", 30000, 1_790_000_000.25))
    d = payload_server(own("decode", 30000, 1_790_000_003.5))
    alias = d.url.replace("127.0.0.1", "localhost")
    r = router(
        payload_server,
        R.smg_entry(p.url, "prefill", bootstrap_port=8998),
        R.smg_entry(d.url, "decode"),
        R.smg_entry(alias, "decode"),
    )
    code, doc = check("--router-url", r.url)
    assert code == ExitStatus.INCONCLUSIVE
    [dup] = [f for f in of(doc, "fleet.router-identity") if f["outcome"] != "passed"]
    assert dup["blocking"] and "under 2 URLs" in dup["summary"] and alias in dup["summary"]
    r.routes["/workers"] = Route(
        R.smg_workers(R.smg_entry(p.url, "prefill", bootstrap_port=8998), R.smg_entry(d.url, "decode"))
    )
    code, doc = check("--router-url", r.url)
    assert code == ExitStatus.PASSED, [f["summary"] for f in doc["findings"] if f["outcome"] != "passed"]


@pytest.mark.parametrize(
    "routed, reported, why",
    [
        ([0, 1, 2], 2, "routes to rank(s) [2] the worker does not report"),
        ([0], 2, "reports rank(s) [1] the router does not list"),
    ],
)
def test_case_1_ranks_the_router_and_the_worker_disagree_on_block(
    payload_server: Callable[..., PayloadServer], routed: list[int], reported: int, why: str
) -> None:
    p = payload_server(routes("prefill", dp=reported))
    d = payload_server(routes("decode"))
    entries = [
        R.smg_entry(f"{p.url}@{k}", "prefill", bootstrap_port=8998, dp_base_url=p.url, dp_rank=k, dp_size=reported)
        for k in routed
        if k < reported
    ] + [R.smg_entry(f"{p.url}@{k}", "prefill", dp_base_url=p.url, dp_rank=k) for k in routed if k >= reported]
    r = router(payload_server, *entries, R.smg_entry(d.url, "decode"))
    code, doc = check("--router-url", r.url)
    assert code == ExitStatus.INCONCLUSIVE, [f["summary"] for f in doc["findings"] if f["outcome"] != "passed"]
    ident = [f for f in of(doc, "fleet.router-identity") if f["node"].startswith("prefill")]
    assert ident and why in ident[0]["summary"] and ident[0]["blocking"]


def test_case_1_a_routed_rank_kvgate_could_not_read_is_not_counted(
    payload_server: Callable[..., PayloadServer],
) -> None:
    info = P.server_info("0.5.22", mode="prefill", pool=BIG, rank_pools=[BIG, BIG])
    del info["internal_states"][1]["memory_usage"]  # rank 1 answers without its pool
    p = payload_server(routes("prefill", info=info))
    d = payload_server(routes("decode"))
    entries = [
        R.smg_entry(f"{p.url}@{k}", "prefill", bootstrap_port=8998, dp_base_url=p.url, dp_rank=k, dp_size=2)
        for k in (0, 1)
    ]
    r = router(payload_server, *entries, R.smg_entry(d.url, "decode"))
    code, doc = check("--router-url", r.url, "--no-strict")
    assert code in (ExitStatus.GATE_FAILED, ExitStatus.INCONCLUSIVE)
    [ident] = [f for f in of(doc, "fleet.router-identity") if f["outcome"] != "passed"]
    assert "routed rank(s) [1] could not be read" in ident["summary"]


# --- case 2: prefill and decode that cannot be one deployment -----------------------------------


def test_case_2_a_pair_serving_two_models_over_two_backends_fails(payload_server: Callable[..., PayloadServer]) -> None:
    pinfo = P.server_info("0.5.22", mode="prefill", pool=BIG, backend="mooncake")
    dinfo = P.server_info("0.5.22", mode="decode", pool=BIG, backend="nixl")
    dinfo["model_path"] = "meta-llama/Llama-3.1-70B-Instruct"
    dinfo["kv_cache_dtype"], pinfo["kv_cache_dtype"] = "fp8_e4m3", "bfloat16"
    p = payload_server(routes("prefill", info=pinfo))
    d = payload_server(routes("decode", info=dinfo))
    d.routes["/model_info"] = Route({**P.model_info("0.5.22", "decode"), "architectures": ["LlamaForCausalLM"]})
    code, doc = check("--prefill-url", p.url, "--decode-url", d.url)
    assert code == ExitStatus.GATE_FAILED
    fails = {f["summary"].split(":")[0]: f for f in of(doc, "fleet.pair-consistency")}
    assert set(fails) == {
        "prefill and decode disagree on the architectures",
        "prefill and decode disagree on the model",
        "prefill and decode disagree on the transfer backend",
        "prefill and decode disagree on the KV cache dtype",
    }
    backend = fails["prefill and decode disagree on the transfer backend"]["summary"]
    assert "prefill 'mooncake'" in backend and "decode 'nixl'" in backend
    assert "'GLM-5.3'" in fails["prefill and decode disagree on the model"]["summary"]
    assert "'Llama-3.1-70B-Instruct'" in fails["prefill and decode disagree on the model"]["summary"]


def test_case_2_what_legitimately_differs_does_not_block(payload_server: Callable[..., PayloadServer]) -> None:
    """One checkpoint under two folders, mooncake_tcp against mooncake, `auto` against a named dtype,
    bf16 against bfloat16: one deployment."""
    pinfo = P.server_info("0.5.22", mode="prefill", pool=BIG, backend="mooncake_tcp")
    dinfo = P.server_info("0.5.22", mode="decode", pool=BIG, backend="mooncake")
    pinfo["model_path"], dinfo["model_path"] = "/mnt/a/GLM-5.3", "/data/models/GLM-5.3/"
    pinfo["kv_cache_dtype"], dinfo["kv_cache_dtype"] = "auto", "bf16"
    p = payload_server(routes("prefill", info=pinfo))
    d = payload_server(routes("decode", info=dinfo))
    d2 = payload_server(routes("decode", info={**dinfo, "kv_cache_dtype": "bfloat16"}))
    code, doc = check("--prefill-url", p.url, "--decode-url", d.url, "--decode-url", d2.url)
    assert code == ExitStatus.PASSED, [f["summary"] for f in doc["findings"] if f["outcome"] != "passed"]
    [ok] = of(doc, "fleet.pair-consistency")
    assert ok["outcome"] == "passed" and "transfer backend mooncake" in ok["summary"]


# --- case 3: a capacity that is not an integer --------------------------------------------------


@pytest.mark.parametrize(
    "field, value",
    [
        ("max_total_num_tokens", 1e308),
        ("max_total_num_tokens", 2_040_000.0),
        ("max_total_num_tokens", True),
        ("max_total_num_tokens", "2040000"),
        ("max_total_num_tokens", -5),
        ("max_total_num_tokens", 10**18),
        ("max_req_input_len", 1e308),
        ("page_size", 64.0),
        ("dp_size", 1.0),
    ],
)
def test_case_3_a_number_that_is_not_a_sane_integer_blocks(
    payload_server: Callable[..., PayloadServer], field: str, value: object
) -> None:
    info = P.server_info("0.5.22", mode="prefill", pool=BIG)
    info[field] = value
    p = payload_server(routes("prefill", info=info))
    d = payload_server(routes("decode"))
    code, doc = check("--prefill-url", p.url, "--decode-url", d.url, "--no-strict")
    assert code == ExitStatus.GATE_FAILED, code
    [num] = of(doc, "pool-context.number")
    assert num["outcome"] == "failed" and num["node"].startswith("prefill[0]") and field in num["summary"]


def test_case_3_a_rank_capacity_of_1e308_blocks(payload_server: Callable[..., PayloadServer]) -> None:
    info = P.server_info("0.5.22", mode="decode", pool=BIG, rank_pools=[BIG, BIG])
    info["internal_states"][1]["memory_usage"]["token_capacity"] = 1e308
    p = payload_server(routes("prefill"))
    d = payload_server(routes("decode", info=info))
    code, doc = check("--prefill-url", p.url, "--decode-url", d.url)
    assert code == ExitStatus.GATE_FAILED
    [num] = of(doc, "pool-context.number")
    assert "internal_states[1].memory_usage.token_capacity" in num["summary"]


# --- case 4: two answers for one fact -----------------------------------------------------------


def test_case_4_two_answers_for_the_context_block(payload_server: Callable[..., PayloadServer]) -> None:
    info = P.server_info("0.5.22", mode="prefill", pool=BIG, context=8_192, context_flag=1_048_576)
    p = payload_server(routes("prefill", info=info, context=8_192))
    d = decode_at_8k(payload_server)
    code, doc = check("--prefill-url", p.url, "--decode-url", d.url)
    assert code == ExitStatus.INCONCLUSIVE
    [two] = [f for f in of(doc, "pool-context.context-sources") if f["outcome"] != "passed"]
    assert "says 8,192" in two["summary"] and "says 1,048,576" in two["summary"]


def test_case_4_a_disagreement_that_changes_the_verdict_blocks_without_strict(
    payload_server: Callable[..., PayloadServer],
) -> None:
    """A pool of 681,280 holds 8,192 but not 1,048,576: which answer is the server's decides the verdict."""
    pool = 681_280
    info = P.server_info("0.5.22", mode="prefill", pool=pool, context=8_192, context_flag=1_048_576)
    p = payload_server(routes("prefill", info=info, context=8_192))
    d = decode_at_8k(payload_server)
    code, doc = check("--prefill-url", p.url, "--decode-url", d.url, "--no-strict")
    assert code == ExitStatus.INCONCLUSIVE
    [two] = [f for f in of(doc, "pool-context.context-sources") if f["outcome"] != "passed"]
    assert two["blocking"] and "verdict differs" in two["summary"]


def test_case_4_the_scheduler_bound_that_implies_another_context(payload_server: Callable[..., PayloadServer]) -> None:
    """max_req_input_len 8,186 says the scheduler runs a context of 8,192 while /v1/models says
    1,048,576 and the pool (681,280) holds only the smaller: the verdict rests on which is true."""
    info = P.server_info("0.5.22", mode="prefill", pool=681_280, context=8_192)
    p = payload_server(routes("prefill", info=info, context=1_048_576))
    d = payload_server(routes("decode"))
    code, doc = check("--prefill-url", p.url, "--decode-url", d.url, "--no-strict")
    assert code == ExitStatus.GATE_FAILED  # the effective context (1,048,576) does not fit the pool
    [two] = [f for f in of(doc, "pool-context.context-sources") if f["outcome"] != "passed"]
    assert two["blocking"] and "max_req_input_len" in two["summary"] and "8,192" in two["summary"]


def test_agreeing_context_sources_pass(payload_server: Callable[..., PayloadServer]) -> None:
    info = P.server_info("0.5.22", mode="prefill", pool=BIG, context=8_192, context_flag=8_192)
    p = payload_server(routes("prefill", info=info, context=8_192))
    d = decode_at_8k(payload_server)
    code, doc = check("--prefill-url", p.url, "--decode-url", d.url)
    assert code == ExitStatus.PASSED, [f["summary"] for f in doc["findings"] if f["outcome"] != "passed"]
    assert {f["outcome"] for f in of(doc, "pool-context.context-sources")} == {"passed"}


# --- the property: exit 0 only when every routed worker and rank was read and all views agree ---

SLOTS = 4


@pytest.fixture(scope="module")
def slots() -> Iterator[list[PayloadServer]]:
    servers = [PayloadServer().start() for _ in range(SLOTS + 1)]  # the last one is the router
    yield servers
    for s in servers:
        s.stop()


MUTATIONS = (
    "url-names-another-worker",
    "listed-twice",
    "router-lists-an-extra-rank",
    "router-misses-a-rank",
    "worker-misses-a-rank",
    "rank-unreadable",
    "router-role-differs",
    "extra-entry-unreachable",
    "given-worker-not-listed",
    "listed-worker-not-given",
    "dp-rank-not-an-integer",
)


@st.composite
def fleets(draw: st.DrawFn) -> tuple[list[tuple[str, int, bool]], list[tuple[str, int]], bool]:
    """Workers (role, dp_size, listed DP-aware), mutations (what, which worker), and whether the
    worker URLs are given besides the router."""
    n = draw(st.integers(2, SLOTS))
    roles = ["prefill", "decode"] + draw(
        st.lists(st.sampled_from(["prefill", "decode"]), min_size=n - 2, max_size=n - 2)
    )
    workers = [(role, draw(st.integers(1, 3)), draw(st.booleans())) for role in roles]
    mutations = draw(st.lists(st.tuples(st.sampled_from(MUTATIONS), st.integers(0, n - 1)), max_size=2))
    return workers, mutations, draw(st.booleans())


def _applies(what: str, dp: int, aware: bool, given_urls: bool, n: int) -> bool:
    """Whether a mutation makes a difference on this worker (some need ranks, given URLs, or a neighbour)."""
    if what in ("router-lists-an-extra-rank", "router-misses-a-rank", "dp-rank-not-an-integer"):
        return aware and (what != "router-misses-a-rank" or dp > 1)
    if what in ("worker-misses-a-rank", "rank-unreadable"):
        return True
    if what in ("given-worker-not-listed", "listed-worker-not-given"):
        return given_urls
    return True


@settings(max_examples=60, deadline=None, database=None)
@given(fleet=fleets())
def test_exit_0_only_when_every_routed_worker_and_rank_was_read_and_all_views_agree(
    slots: list[PayloadServer], fleet: tuple[list[tuple[str, int, bool]], list[tuple[str, int]], bool]
) -> None:
    workers, mutations, given_urls = fleet
    mutations = [(w, i) for w, i in mutations if _applies(w, workers[i][1], workers[i][2], given_urls, len(workers))]
    muts = {(w, i) for w, i in mutations}
    servers, rtr = slots[: len(workers)], slots[-1]
    entries: list[dict[str, Any]] = []
    given_args: list[str] = []
    for i, ((role, dp, aware), srv) in enumerate(zip(workers, servers, strict=False)):
        info = P.server_info("0.5.22", mode=role, pool=BIG, rank_pools=[BIG] * dp)
        if ("worker-misses-a-rank", i) in muts:
            info["internal_states"].pop()
        if ("rank-unreadable", i) in muts:
            del info["internal_states"][-1]["memory_usage"]
        srv.routes = routes(role, info=info)
        listed_role = ("decode" if role == "prefill" else "prefill") if ("router-role-differs", i) in muts else role
        port = {"bootstrap_port": 8998} if listed_role == "prefill" else {}
        if aware:
            ranks = list(range(dp))
            if ("router-misses-a-rank", i) in muts:
                ranks.pop()
            if ("router-lists-an-extra-rank", i) in muts:
                ranks.append(dp)
            for k in ranks:
                extra: dict[str, Any] = {"dp_base_url": srv.url, "dp_rank": k, "dp_size": dp}
                if ("dp-rank-not-an-integer", i) in muts:
                    extra["dp_rank"] = float(k)
                if ("url-names-another-worker", i) in muts:
                    extra["dp_base_url"] = servers[(i + 1) % len(workers)].url
                entries.append(R.smg_entry(f"{srv.url}@{k}", listed_role, **port, **extra))
        else:
            extra = (
                {"dp_base_url": servers[(i + 1) % len(workers)].url} if ("url-names-another-worker", i) in muts else {}
            )
            entries.append(R.smg_entry(srv.url, listed_role, **port, **extra))
        if ("listed-twice", i) in muts:  # the same worker (and rank) under another spelling
            entries.append({**entries[-1], "url": entries[-1]["url"] + ("" if aware else "/")})
        if given_urls and ("listed-worker-not-given", i) not in muts:
            given_args += [f"--{role}-url", srv.url]
        if ("given-worker-not-listed", i) in muts:
            entries = [e for e in entries if e["url"].split("@")[0].rstrip("/") != srv.url]
    if given_urls and not given_args:  # nothing given: router-only, where "not given" means nothing
        mutations = [(w, i) for w, i in mutations if w != "listed-worker-not-given"]
    if any(w == "extra-entry-unreachable" for w, _ in mutations):
        entries.append(R.smg_entry("http://127.0.0.1:1", "decode"))
    if not entries:
        return  # a router that lists nothing is its own test (tests/reading/test_discovery.py)
    rtr.routes = {"/workers": Route(R.smg_workers(*entries)), "/readiness": Route({"status": "ready"})}
    code, doc = check("--router-url", rtr.url, *given_args)
    problems = [
        f"{f['gate']}.{f['check']} {f['summary']}" for f in doc["findings"] if f["outcome"] not in ("passed", "info")
    ]
    if not mutations:
        assert code == ExitStatus.PASSED, problems
    else:
        assert code != ExitStatus.PASSED, (mutations, [e["url"] for e in entries])

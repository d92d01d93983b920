"""One fleet reader, one set of facts: what `kvgate check` and `kvgate watch` read from every worker.

`READS` is the fact list: each worker's server_info (`/server_info`, else the older `/get_server_info`;
every DP rank's `internal_states` is in it), `/v1/models` (the context the server admits) and
`/model_info` (else `/get_model_info`: the architectures). The router's listing comes from
`discovery.list_router_workers`. Every worker's GETs go out at once, `width` workers in flight, on one
thread (`wideread`): a fleet of 1,024 costs about one slow answer, not 1,024/width of them
(bench/fleet_read.py prints it beside a bare-socket floor). Each answer is bounded as
`httpbounds` bounds the client's: the whole exchange within the timeout, the body within the metadata
cap, a compressed answer refused; judged by `node.decode_answer` and parsed by `node.parse_node`,
as one worker read through `TargetClient.read_node` is.

`judged_facts` is the part of a reading the gates judge: what a watch compares pass after pass, and
what `check`'s second look compares with the first read (kvgate/pipeline/stability.py).
"""

from __future__ import annotations

import contextlib
import gc
import math
import ssl
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

from kvgate.defaults import METADATA_BODY_CAP
from kvgate.errors import TransportError
from kvgate.reading.compact import compact_info, compact_model_info, compact_models
from kvgate.reading.http11 import Answer, Failure
from kvgate.reading.node import NodeReading, NodeSpec, decode_answer, parse_node
from kvgate.reading.wideread import get_each

#: What is read from every worker: each entry is one fact's paths, the older one tried on a 404.
READS: tuple[tuple[str, ...], ...] = (
    ("/server_info", "/get_server_info"),
    ("/v1/models",),
    ("/model_info", "/get_model_info"),
)


def _info(doc: Any) -> Any:
    return compact_info(doc) if isinstance(doc, dict) else doc  # not an object: the reading says so


#: per fact of READS, what is kept of its document
_COMPACT: tuple[Callable[[Any], Any], ...] = (_info, compact_models, compact_model_info)

#: server_info keys that move without any change of configuration (load, clocks, live state). What the
#: gates judge inside `internal_states` (each rank's pool, role and env) is compared through the ranks;
#: `startup_time` (the top level's and each rank's) through `process_identity`, a fact of its own.
VOLATILE_KEYS = frozenset(
    {"internal_states", "startup_time", "status", "last_gen_throughput", "load", "uptime", "num_running_reqs"}
)

#: sockets kept free for everything else in the process when the reader sizes its width to the fd limit
_FD_SPARE = 64


def _fd_room(sockets: int) -> int:
    """How many sockets may be open at once: the soft fd limit is raised toward the hard one as far as
    `sockets` needs (a fleet of 1,024 is 3,072 GETs at once); where it cannot be, what it allows."""
    try:
        import resource
    except ImportError:  # not POSIX: no limit to ask about
        return sockets
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = sockets + _FD_SPARE
    if soft != resource.RLIM_INFINITY and soft < want:
        new = want if hard == resource.RLIM_INFINITY else min(want, hard)
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (new, hard))
            soft = new
        except (ValueError, OSError):
            pass
    if soft == resource.RLIM_INFINITY:
        return sockets
    return max(1, min(sockets, soft - _FD_SPARE))


def _problem(where: str, failure: Failure) -> TransportError:
    reason = failure.reason
    return TransportError(where, reason[len(where) + 2 :] if reason.startswith(where + ": ") else reason)


class _Node:
    """One worker's answers as they arrive: per fact its (path, document), None (every path 404), or
    the TransportError that ended it."""

    def __init__(self, spec: NodeSpec) -> None:
        self.spec = spec
        self.got: list[tuple[str, Any] | None | TransportError | bool] = [False] * len(READS)  # False: not yet
        self.result: NodeReading | TransportError | None = None

    def settle(self, j: int, got: tuple[str, Any] | None | TransportError, on_done: Callable[[], None] | None) -> None:
        """Fact `j` is in; once all are, the reading is parsed at once (while other answers still come)."""
        self.got[j] = got
        if self.done():
            self.result = self.reading()
            if on_done is not None:
                on_done()

    def done(self) -> bool:
        return all(g is not False for g in self.got)

    def reading(self) -> NodeReading | TransportError:
        for g in self.got:
            if isinstance(g, TransportError):
                return g
        info, models, model_info = self.got
        base = self.spec.url.rstrip("/")
        if info is None:
            return TransportError(base, "neither /server_info nor /get_server_info exists: not an SGLang worker?")
        assert isinstance(info, tuple)
        path, doc = info
        if not isinstance(doc, dict):
            return TransportError(base + path, f"expected a JSON object, got {type(doc).__name__}")
        return parse_node(
            self.spec,
            path,
            doc,
            models[1] if isinstance(models, tuple) else None,
            model_info[1] if isinstance(model_info, tuple) else None,
        )


def read_workers(
    specs: Sequence[NodeSpec],
    *,
    timeout: float,
    token: str | None = None,
    width: int,
    deadline: float | None = None,
    ssl_context: ssl.SSLContext | None = None,
    body_cap: int = METADATA_BODY_CAP,
    on_done: Callable[[], None] | None = None,
    on_sent: Callable[[], None] | None = None,
    deadline_name: str = "the whole read's deadline",
) -> list[NodeReading | TransportError]:
    """Read every fact of every worker; one NodeReading or TransportError per spec, in order.

    `width` workers are read at once (their GETs all in flight together). Each answer ends within
    `timeout` of its request's start, and none outlives `deadline` (time.monotonic(); without one, as
    many timeouts as the reads need). `on_done` runs as each worker's reading is complete; `on_sent`
    once, when every first GET has been sent (the watch lists the router then).
    """
    if not specs:
        return []
    with _collections_paused():
        return _read_workers(
            specs, timeout, token, width, deadline, ssl_context, body_cap, on_done, on_sent, deadline_name
        )


@contextlib.contextmanager
def _collections_paused() -> Iterator[None]:
    """The cyclic garbage collector held off for one read, restarted by whoever stopped it. A fleet's
    answers are tens of thousands of small JSON objects that live until their reading is built: each
    collection walked them again (a fifth to a third of a 1,024-worker check's client CPU,
    bench/fleet_read.py). Nothing here forms cycles; refcounting frees each body as it is judged."""
    stopped = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if stopped:
            gc.enable()


def _read_workers(
    specs: Sequence[NodeSpec],
    timeout: float,
    token: str | None,
    width: int,
    deadline: float | None,
    ssl_context: ssl.SSLContext | None,
    body_cap: int,
    on_done: Callable[[], None] | None,
    on_sent: Callable[[], None] | None,
    deadline_name: str,
) -> list[NodeReading | TransportError]:
    nodes = [_Node(s) for s in specs]
    if deadline is None:
        rounds = math.ceil(len(specs) / max(1, width)) * len(max(READS, key=len))
        deadline = time.monotonic() + (rounds + 1) * timeout
    headers = f"Authorization: Bearer {token}\r\n" if token else ""
    sockets = _fd_room(width * len(READS))
    # (node, fact, alternative) of every GET still to make; first every fact's first path.
    todo = [(n, j, 0) for n in range(len(nodes)) for j in range(len(READS))]
    while todo:
        batch = list(todo)
        todo.clear()

        def judge(
            k: int, got: Answer, batch: list[tuple[int, int, int]] = batch, todo: list[tuple[int, int, int]] = todo
        ) -> None:
            n, j, alt = batch[k]
            node = nodes[n]
            path = READS[j][alt]
            try:
                where = node.spec.url.rstrip("/") + path
                doc = decode_answer(where, got.status, got.body, got.location, missing_ok=True)
            except TransportError as exc:
                node.settle(j, exc, on_done)
                return
            if doc is None and alt + 1 < len(READS[j]):
                todo.append((n, j, alt + 1))
            else:  # only the facts the gates judge are kept, not the document (kvgate/reading/compact.py)
                node.settle(j, None if doc is None else (path, _COMPACT[j](doc)), on_done)

        answers = get_each(
            [(nodes[n].spec.url.rstrip("/"), READS[j][alt]) for n, j, alt in batch],
            headers=headers,
            timeout=timeout,
            deadline=deadline,
            width=sockets,
            body_cap=body_cap,
            ssl_context=ssl_context,
            on_answer=judge,
            on_sent=on_sent,
            deadline_name=deadline_name,
            cap_name="metadata cap",
            keep_bodies=False,  # each body is judged (and dropped) as it arrives
        )
        on_sent = None
        for (n, j, alt), got in zip(batch, answers, strict=True):
            if isinstance(got, Failure):
                node = nodes[n]
                node.settle(j, _problem(node.spec.url.rstrip("/") + READS[j][alt], got), on_done)
    return [n.result if n.result is not None else n.reading() for n in nodes]


def judged_facts(reading: NodeReading) -> dict[str, object]:
    """Every fact of a reading the gates judge, by name: each parsed field, each DP rank's pool, role
    and env, what could not be read (the problems), and every server_info flag but the volatile ones.
    Load, clocks and live counters are left out, so an idle or busy fleet compares equal pass after pass;
    the process's identity (`process_identity`: its startup times) is in, so a restart is a change.
    """
    out: dict[str, object] = {
        "role": reading.role,
        "version": reading.version,
        "pool": reading.max_total_num_tokens,
        "context": reading.context_length,
        "context_source": reading.context_source,
        "context_length_flag": reading.context_length_flag,
        "max_req_input_len": reading.max_req_input_len,
        "page_size": reading.page_size,
        "transfer_backend": reading.transfer_backend,
        "bootstrap_port": reading.bootstrap_port,
        "kv_checksum": reading.kv_checksum,
        "kv_canary": reading.kv_canary,
        "tp_size": reading.tp_size,
        "dp_size": reading.dp_size,
        "dp_attention": reading.dp_attention,
        "allow_auto_truncate": reading.allow_auto_truncate,
        "model_path": reading.model_path,
        "served_model": reading.served_model,
        "architectures": reading.architectures,
        "info_path": reading.info_path,
        "dp_ranks": reading.rank_entries,
    }
    for rank in reading.ranks:
        out[f"dp{rank.dp_rank} pool"] = rank.token_capacity
        out[f"dp{rank.dp_rank} role"] = rank.disaggregation_mode
        out[f"dp{rank.dp_rank} env"] = None if rank.env_vars is None else dict(sorted(rank.env_vars.items()))
    for p in reading.problems:
        out[f"problem {p.field}"] = p.problem
    out["process"] = process_identity(reading.server_info)
    out.update(flags(reading.server_info))
    return out


#: the fixed keys of `judged_facts` (besides them: `dpN ...` per rank, `problem FIELD`, `flag KEY`)
JUDGED_KEYS = (
    "role",
    "version",
    "pool",
    "context",
    "context_source",
    "context_length_flag",
    "max_req_input_len",
    "page_size",
    "transfer_backend",
    "bootstrap_port",
    "kv_checksum",
    "kv_canary",
    "tp_size",
    "dp_size",
    "dp_attention",
    "allow_auto_truncate",
    "model_path",
    "served_model",
    "architectures",
    "info_path",
    "dp_ranks",
    "process",
)


def process_identity(info: Mapping[str, Any]) -> dict[str, object]:
    """Which processes answered: the server's `startup_time` and each DP rank scheduler's (in
    `internal_states`). A restart moves it even with the same flags and version label, and a restarted
    worker may run other code: it is a new worker, gated whole again (the watch compares this fact)."""
    states = info.get("internal_states")
    ranks = [s.get("startup_time") for s in states if isinstance(s, dict)] if isinstance(states, list) else []
    # Sorted: a DP worker lists its ranks in whatever order their answers came (seen on the real --dp-size 2
    # pair: two reads of one process, ranks swapped); a restart still moves the values.
    return {"startup_time": info.get("startup_time"), "ranks": sorted(ranks, key=repr)}


def flags(info: Mapping[str, Any]) -> dict[str, object]:
    """server_info's non-volatile keys, each as `flag KEY` (what a restart with other flags moves)."""
    return {f"flag {k}": v for k, v in sorted(info.items(), key=lambda kv: str(kv[0])) if k not in VOLATILE_KEYS}


__all__ = [
    "JUDGED_KEYS",
    "READS",
    "VOLATILE_KEYS",
    "judged_facts",
    "flags",
    "process_identity",
    "read_workers",
]

"""Field extraction across the 0.5.19-0.5.23 server_info shapes."""

from __future__ import annotations

import pytest

from kvgate.reading.node import NodeSpec, parse_node
from tests.assets import sglang_payloads as P

SPEC = NodeSpec("prefill", "http://p", 0)


@pytest.mark.parametrize("version", ["0.5.19", "0.5.20", "0.5.21", "0.5.22", "0.5.23"])
def test_every_release_shape_parses(version: str) -> None:
    r = parse_node(SPEC, "/server_info", P.server_info(version, pool=2_040_000), P.v1_models(), P.model_info(version))
    assert r.problems == ()
    assert r.version == version
    assert r.context_length == 1_048_576 and r.context_length_flag is None
    assert r.max_total_num_tokens == 2_040_000 and r.pool_key == "max_total_num_tokens"
    assert r.max_req_input_len == 1_048_570
    assert r.role == "prefill" and r.transfer_backend == "mooncake"
    assert r.kv_checksum is (None if version in ("0.5.19", "0.5.20") else False)
    assert r.architectures == ("GlmMoeDsaForCausalLM",)
    assert [rk.token_capacity for rk in r.ranks] == [2_040_000]


def test_live_role_from_internal_states_wins() -> None:
    doc = P.server_info("0.5.23", mode="prefill")
    for s in doc["internal_states"]:
        s["disaggregation_mode"] = "decode"  # after /pd_role_switch
    r = parse_node(SPEC, "/server_info", doc, P.v1_models(), None)
    assert r.disaggregation_mode == "prefill" and r.role == "decode"


@pytest.mark.parametrize("bad", ["681280", -5, True, 3.5, None])
def test_malformed_pool_is_a_problem_not_a_guess(bad: object) -> None:
    doc = P.server_info()
    doc["max_total_num_tokens"] = bad
    r = parse_node(SPEC, "/server_info", doc, P.v1_models(), None)
    assert r.max_total_num_tokens is None
    assert r.problem("max_total_num_tokens") is not None


def test_operator_cap_is_not_read_as_the_pool() -> None:
    doc = P.server_info(drop=("max_total_num_tokens",))
    doc["max_total_tokens"] = 5_000_000  # the operator's flag, not the sized pool
    r = parse_node(SPEC, "/server_info", doc, P.v1_models(), None)
    assert r.max_total_num_tokens is None and r.problem("max_total_num_tokens") is not None


def test_missing_models_endpoint_and_internal_states() -> None:
    doc = P.server_info(drop=("internal_states",), context_flag=1_048_576)
    r = parse_node(SPEC, "/server_info", doc, None, None)
    assert r.context_length is None and r.context_length_flag == 1_048_576
    assert {p.field for p in r.problems} == {"/v1/models", "internal_states"}


def test_env_vars_are_read_when_exposed() -> None:
    env = {"SGLANG_DISAGGREGATION_DEFERRED_DECODE_KV_RELEASE": "1"}
    r = parse_node(SPEC, "/server_info", P.server_info(env_vars=env), P.v1_models(), None)
    assert r.env_vars == env


def test_null_required_strings_are_problems() -> None:
    doc = P.server_info()
    doc["version"] = None
    r = parse_node(SPEC, "/server_info", doc, P.v1_models(), None)
    assert r.version is None and r.problem("version") is not None


# --- reading a fleet: the concurrency bound and the deadlines, against a real loopback server ------------


class _FleetServer:
    """One HTTP server standing in for many workers at `/w<N>`; counts requests in flight."""

    def __init__(self, delay_s: float, missing: tuple[str, ...] = ()) -> None:
        import threading
        from http.server import BaseHTTPRequestHandler

        from tests.assets.loopback import LoopbackServer

        self.in_flight = 0
        self.max_in_flight = 0
        lock = threading.Lock()
        owner = self
        info, model = P.server_info("0.5.22", pool=2_040_000), P.model_info("0.5.22")
        docs = {
            "/server_info": info,
            "/get_server_info": info,
            "/v1/models": P.v1_models(),
            "/model_info": model,
            "/get_model_info": model,
        }

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: object) -> None:
                pass

            def do_GET(self) -> None:  # noqa: N802
                import json
                import time

                path = "/" + self.path.split("/", 2)[2]
                with lock:
                    owner.in_flight += 1
                    owner.max_in_flight = max(owner.max_in_flight, owner.in_flight)
                time.sleep(delay_s)
                with lock:
                    owner.in_flight -= 1
                doc = None if path in missing else docs.get(path)
                data = json.dumps(doc if doc is not None else {"detail": "Not Found"}).encode()
                try:
                    self.send_response(200 if doc is not None else 404)
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)
                except (BrokenPipeError, ConnectionResetError):
                    pass

        self.server = LoopbackServer(("127.0.0.1", 0), Handler)  # every worker's GETs arrive at once
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"

    def specs(self, n: int) -> list[NodeSpec]:
        return [NodeSpec("prefill", f"{self.url}/w{i}", i) for i in range(n)]

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.mark.parametrize("concurrency,workers", [(4, 12), (64, 64)])
def test_reads_run_at_once_up_to_the_bound(concurrency: int, workers: int) -> None:
    from kvgate.reading.target import TargetClient

    srv = _FleetServer(delay_s=0.3)
    done: list[int] = []
    try:
        with TargetClient(timeout=20, concurrency=concurrency) as client:
            results = client.read_nodes(srv.specs(workers), on_done=lambda: done.append(1))
    finally:
        srv.stop()
    assert all(not isinstance(r, Exception) for r in results)
    assert len(done) == workers  # progress: one tick per worker
    # The bound holds (`concurrency` workers, each with its GETs in flight together: fleetread.READS),
    # and reads really overlap beyond the old fixed 16 when allowed.
    from kvgate.reading.fleetread import READS

    assert srv.max_in_flight <= concurrency * len(READS)
    assert srv.max_in_flight > (concurrency if concurrency < 16 else 16)


def test_a_node_that_needs_too_long_hits_its_own_deadline() -> None:
    import time

    from kvgate.errors import TransportError
    from kvgate.reading.target import TargetClient

    # Five sequential requests (both fallbacks taken) of 0.4 s each, every one far within the 5 s
    # timeout: the node's read (2 s) is not within its 1 s deadline.
    srv = _FleetServer(delay_s=0.4, missing=("/server_info", "/model_info"))
    try:
        with TargetClient(timeout=5) as client:
            with pytest.raises(TransportError, match="deadline"):
                client.read_node(srv.specs(1)[0], deadline=time.monotonic() + 1.0)
    finally:
        srv.stop()


def test_the_whole_read_has_one_deadline() -> None:
    from kvgate.errors import TransportError
    from kvgate.reading.target import TargetClient

    srv = _FleetServer(delay_s=0.4)
    try:
        with TargetClient(timeout=5, concurrency=1) as client:
            results = client.read_nodes(srv.specs(3), read_deadline_s=0.5)
    finally:
        srv.stop()
    # The first worker's GETs go out together (whether they end within the deadline is a race on a busy
    # machine); the others' turn comes after it.
    assert all(isinstance(r, TransportError) for r in results[1:])
    assert "whole read's deadline" in results[-1].problem

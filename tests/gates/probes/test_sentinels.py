"""Sentinels: fresh, dense, found whole or in fragments, attributed."""

from __future__ import annotations

from kvgate.gates.probes.sentinels import (
    ANY_SENTINEL,
    PARTIAL,
    WHOLE,
    ByteCodec,
    Sentinel,
    new_sentinel,
    owners,
    plant_ids,
    scan,
)
from kvgate.sim import tokenizer as sim_tokenizer
from tests.assets.loopback import LoopbackServer


def test_fresh_per_call() -> None:
    cores = {new_sentinel("x").core for _ in range(200)}
    assert len(cores) == 200 and all(ANY_SENTINEL.fullmatch(c) for c in cores)


def test_dense_plant_round_trips_through_the_simulator_tokenizer() -> None:
    s = new_sentinel("plant")
    ids = plant_ids(ByteCodec(), s, 1000)
    assert len(ids) == 1000
    text = sim_tokenizer.decode(ids)
    assert s.found_in(text)
    page = 16
    # at least one whole sentinel per 2 pages, a fragment in every page
    for i in range(0, 1000 - page, page):
        assert s.found_in(sim_tokenizer.decode(ids[i : i + page]))


def test_scan_attributes_foreign_and_ignores_own() -> None:
    a, b = new_sentinel("plant (100 tokens)"), new_sentinel("over (200 tokens)")
    assert scan("over", b, f"{b.text}\n{b.text}", [a, b]) == []
    hits = scan("over (200 tokens)", b, f"xx{a.text[4:12]}yy", [a, b])  # a fragment of a
    assert [(h.source, h.victim, h.kind) for h in hits] == [("plant (100 tokens)", "over (200 tokens)", PARTIAL)]
    assert f"{a.text} (partial match: only fragment {a.text[4:12]} seen)" in owners(hits)[0]
    hits = scan("over (200 tokens)", b, f"xx{a.text}yy", [a, b])
    assert [(h.kind, h.sentinel) for h in hits] == [(WHOLE, a.text)]


def test_issue_route_7_no_sentinel_is_made_up_from_a_fragment() -> None:
    # The issue's shape: an answer glued "KVG" in front of a real core; the undelimited pattern read
    # <KVGKVGITWSYNL> out of it and blamed "an earlier kvgate run".
    mine = Sentinel("mine", "KVGITWSYNLQ2X")
    other = Sentinel("other", "KVGAB234CDEFG")
    for text in ("KVG" + mine.core + ">", "xxKVGKVGITWSYNLxx", "<KVGKVGITWSYNL", "KVGKVGITWSYNL>"):
        assert scan("mine", mine, text, [mine, other]) == [], text
    # An undelimited core of no request of ours is not attributed to anyone either.
    assert scan("mine", mine, "KVGZZZZZZZZZZ", [mine]) == []


def test_scan_flags_sentinels_of_earlier_runs() -> None:
    old = new_sentinel("old run")
    mine = new_sentinel("mine")
    hits = scan("mine", mine, old.text, [mine])
    assert len(hits) == 1 and "earlier kvgate run" in hits[0].source and hits[0].sentinel == old.text


def _tokenizer_server(offset: int, lossy: bool = False):
    """A loopback worker with SGLang's /v1/tokenize and /v1/detokenize over a shifted byte vocabulary."""
    import json
    import threading
    from http.server import BaseHTTPRequestHandler

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args: object) -> None:
            pass

        def do_POST(self) -> None:  # noqa: N802
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            if self.path == "/v1/tokenize":
                out = {"tokens": [b + offset for b in body["prompt"].encode()], "count": 0, "max_model_len": 1}
            else:
                text = bytes(t - offset for t in body["tokens"]).decode()
                out = {"text": text.lower() if lossy else text}
            data = json.dumps(out).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

    srv = LoopbackServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=srv.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
    return srv, f"http://127.0.0.1:{srv.server_address[1]}"


def _readings(url: str, model_path: str = "org/model", simulator: bool = False):
    from kvgate.reading.node import NodeSpec, parse_node
    from tests.assets.sglang_payloads import model_info, server_info, v1_models

    info = server_info(context=4096, pool=8192)
    info["model_path"] = model_path
    if simulator:
        info["kvgate_simulator"] = True  # how the simulator says what it is (never a model path)
    return [parse_node(NodeSpec("prefill", url), "/server_info", info, v1_models(4096), model_info())]


def test_codec_uses_the_workers_tokenizer_when_it_round_trips() -> None:
    import httpx

    from kvgate.gates.probes.codec_select import select_codec
    from kvgate.gates.probes.settings import ProbeSettings

    srv, url = _tokenizer_server(offset=1000)
    try:
        with httpx.Client() as http:
            codec, how = select_codec(http, _readings(url), ProbeSettings())
            assert codec is not None and codec.name == "server" and "round-trip" in how
            s = new_sentinel("x")
            assert plant_ids(codec, s, 40)[:3] == [b + 1000 for b in s.unit.encode()[:3]]
    finally:
        srv.shutdown()


def test_codec_refuses_a_tokenizer_that_does_not_round_trip() -> None:
    import httpx

    from kvgate.gates.probes.codec_select import select_codec
    from kvgate.gates.probes.settings import ProbeSettings

    srv, url = _tokenizer_server(offset=0, lossy=True)
    try:
        with httpx.Client() as http:
            # only the server's tokenizer was asked for: canaries become inconclusive
            codec, how = select_codec(http, _readings(url), ProbeSettings(tokenizer="server"))
            assert codec is None and "does not give the sentinel back" in how
            # auto: sentinels go to token space (id sequences, searched in output_ids)
            codec, how = select_codec(http, _readings(url), ProbeSettings())
            assert codec is not None and codec.name == "token-space" and "does not give the sentinel back" in how
            codec, _ = select_codec(http, _readings(url, "kvgate-sim/byte-echo", simulator=True), ProbeSettings())
            assert codec is not None and codec.name == "bytes"  # the simulator's known tokenizer
            # A real model that merely lives under a folder named kvgate is not the simulator.
            codec, _ = select_codec(http, _readings(url, "/cache/kvgate/tiny-llama"), ProbeSettings())
            assert codec is not None and codec.name == "token-space"
    finally:
        srv.shutdown()


def test_token_space_sentinels_are_found_in_output_ids_and_never_glued_across_foreign_ids() -> None:
    """Issue 19: a server without a tokenizer answers ids only; a sentinel planted as ids is searched there."""
    from kvgate.gates.probes.sentinels import TokenSpaceCodec, scan

    codec = TokenSpaceCodec(offset=3)
    mine, theirs = new_sentinel("mine"), new_sentinel("theirs")
    leaked = [70000, 12] + plant_ids(codec, theirs, 40) + [151643]
    found = scan("mine's answer", mine, codec.decode(leaked), [mine, theirs])
    assert [(x.source, x.kind) for x in found] == [("theirs", "whole")]
    # the same ids with a foreign id inside every sentinel copy: no whole sentinel, no 8-id fragment
    ids = plant_ids(codec, theirs, len(codec.encode(theirs.unit)))
    broken = [i for k, x in enumerate(ids) for i in ((x, 99999) if k % 5 == 4 else (x,))]
    assert scan("mine's answer", mine, codec.decode(broken), [mine, theirs]) == []


def test_a_whole_sentinel_leads_the_summary_before_a_partial_match() -> None:
    """The canary's summary names one sighting first: a whole sentinel over an earlier fragment."""
    from kvgate.gates.probes.sentinels import PARTIAL, WHOLE, Sighting, leading

    partial = Sighting("victim-1", "tenant-a", "<KVGAAAAAAAA1>", PARTIAL, "KVGAAAA")
    whole = Sighting("victim-2", "tenant-b", "<KVGBBBBBBBB2>", WHOLE)
    assert leading([partial, whole]) is whole and leading([whole, partial]) is whole
    assert leading([partial]) is partial  # only a fragment seen: that is what there is to name
    assert "partial match" in leading([partial]).shown

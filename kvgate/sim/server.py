"""SGLang's HTTP surface for a simulated worker (FastAPI + uvicorn).

Routes, shapes, status codes and messages follow `srt/entrypoints/http_server.py` and
`srt/entrypoints/openai/serving_completions.py` of the emulated release (sglang-surface.md
sections 1-2). Simulator-only additions live under `/sim/` and are never used by the router.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import AsyncIterator, Callable
from http import HTTPStatus
from typing import Any

import numpy as np
from fastapi import FastAPI, Request
from fastapi.responses import Response, StreamingResponse

from kvgate.sim import faults, surface, tokenizer
from kvgate.sim.config import env_float
from kvgate.sim.decode import DecodeEngine
from kvgate.sim.engine import BaseEngine
from kvgate.sim.prefill import PrefillEngine
from kvgate.sim.request import Abort, RequestError, SimReq

try:  # optional fast JSON; the simulator works without it
    import orjson as _orjson  # type: ignore[import-not-found]
except ImportError:  # pragma: no cover - depends on the environment
    _orjson = None


def _loads(raw: bytes) -> Any:
    return _orjson.loads(raw) if _orjson is not None else json.loads(raw)


def _json(body: Any, status: int = 200) -> Response:
    data = _orjson.dumps(body) if _orjson is not None else json.dumps(body).encode()
    return Response(content=data, status_code=status, media_type="application/json")


def _top_num(value: Any) -> int:
    """`top_logprobs_num` (an int, or a one-element list for a batch of one); anything else is 0."""
    if isinstance(value, list):
        value = value[0] if value else 0
    return max(0, value) if isinstance(value, int) and not isinstance(value, bool) else 0


def error_response(abort: Abort) -> Response:
    """`/generate` errors: a 400 abort surfaces as ValueError -> `{"error":{"message"}}`; other statuses
    go through the HTTPException handler (`{"object":"error",...}`)."""
    if int(abort.status_code) == HTTPStatus.BAD_REQUEST:
        return _json({"error": {"message": abort.message}}, 400)
    code = int(abort.status_code)
    return _json({"object": "error", "message": abort.message, "type": str(code), "param": None, "code": code}, code)


def openai_error(abort: Abort) -> Response:
    """`serving_base.create_error_response` for /v1/completions."""
    code = int(abort.status_code)
    err_type = "BadRequestError" if code == 400 else str(code)
    return _json({"object": "error", "message": abort.message, "type": err_type, "param": None, "code": code}, code)


def build_app(engine: BaseEngine) -> FastAPI:
    """The worker's FastAPI app around `engine`."""
    cfg = engine.cfg
    release = engine.release
    app = FastAPI(openapi_url=None, docs_url=None, redoc_url=None)
    model_name = cfg.served_model_name or cfg.model_path

    @app.get("/server_info")
    @app.get("/get_server_info")
    async def _server_info() -> Response:
        return _json(
            surface.server_info(
                cfg,
                release,
                pool_tokens=engine.max_total_num_tokens,
                started=engine.started,
                last_gen_throughput=engine.last_gen_throughput,
            )
        )

    @app.get("/model_info")
    @app.get("/get_model_info")
    async def _model_info() -> Response:
        return _json(surface.model_info(cfg, release))

    @app.get("/v1/models")
    async def _models() -> Response:
        return _json(surface.v1_models(cfg, engine.started))

    @app.get("/health")
    @app.get("/health_generate")
    async def _health() -> Response:
        # SGLang runs a one-token generation here (FAKE bootstrap host); the simulator's engine is
        # in-process and always responsive, so a live event loop is the health signal.
        return Response(status_code=200)

    if release.has_ready_endpoint:

        @app.get("/ready")
        async def _ready() -> Response:
            return Response(status_code=200)

    if cfg.enable_metrics:

        @app.get("/metrics")
        async def _metrics() -> Response:
            return Response(engine.metrics_text(model_name), media_type="text/plain; version=0.0.4")

    @app.get("/v1/loads")
    async def _loads_route() -> Response:
        used = engine.pool.num_pages - engine.pool.free_pages
        return _json(
            {
                "timestamp": time.time(),
                "version": release.version,
                "accelerator": "cpu",
                "num_accelerators": 1,
                "loads": [
                    {
                        "dp_rank": 0,
                        "num_running_reqs": len(getattr(engine, "transfers", {})),
                        "num_waiting_reqs": 0,
                        "num_used_tokens": used * engine.pool.page_size,
                        "max_total_num_tokens": engine.max_total_num_tokens,
                        "token_usage": used / max(engine.pool.num_pages, 1),
                    }
                ],
            }
        )

    @app.post("/abort_request")
    async def _abort(request: Request) -> Response:
        body = _loads(await request.body() or b"{}")
        if isinstance(engine, (DecodeEngine, PrefillEngine)):
            engine.abort(body.get("rid"), bool(body.get("abort_all", False)))
        return Response(status_code=200)

    @app.post("/sim/fault")
    async def _fault(request: Request) -> Response:
        """Simulator-only: switch an injected fault (faults.py) on (`{"fault": NAME}`) or off (null)."""
        body = _loads(await request.body() or b"{}")
        if not isinstance(engine, DecodeEngine):
            return _json({"error": "injected faults live on decode workers"}, 400)
        try:
            engine.fault = faults.check(body.get("fault") if isinstance(body, dict) else None)
        except ValueError as exc:
            return _json({"error": str(exc)}, 400)
        after = body.get("after") if isinstance(body, dict) else None
        if after is not None:
            if isinstance(after, bool) or not isinstance(after, int) or after < 0:
                return _json({"error": f"after: expected a whole number of requests, got {after!r}"}, 400)
            engine.drift_after = after
        engine.drift_count, engine.drift_since = 0, None  # a drift counts from when it was switched on
        said: dict[str, Any] = {"fault": engine.fault}
        if engine.fault == faults.GRADUAL_DRIFT:
            said["drift_after"] = engine.drift_after
        return _json(said)

    @app.get("/sim/state")
    async def _state() -> Response:
        return _json(engine.state())

    def parse(body: dict[str, Any], *, prompt_key: str) -> tuple[SimReq, bool]:
        sp = body.get("sampling_params") or {}
        if prompt_key == "prompt":  # /v1/completions
            prompt = body.get("prompt")
            sp = {"max_new_tokens": body.get("max_tokens", 16)}
            text = prompt if isinstance(prompt, str) else None
            ids = prompt if isinstance(prompt, list) else None
        else:
            text, ids = body.get("text"), body.get("input_ids")
        if isinstance(text, list) or (isinstance(ids, list) and ids and isinstance(ids[0], list)):
            if len(text or ids) != 1:
                raise RequestError(Abort("The simulator serves one prompt per request (batch input is not modelled)."))
            text = text[0] if isinstance(text, list) else text
            ids = ids[0] if ids and isinstance(ids[0], list) else ids
        if ids is not None:
            input_ids = np.array(ids, dtype=np.int64).astype(np.int32) if ids else np.zeros(0, dtype=np.int32)
        elif text is not None:
            input_ids = tokenizer.encode_tensor(str(text))
        else:
            raise RequestError(Abort("Either text or input_ids should be provided."))
        max_new = sp.get("max_new_tokens")
        input_ids = engine.tokenizer_stage(input_ids, max_new)
        rid = body.get("rid")
        if isinstance(rid, list):
            rid = rid[0] if rid else None
        room = body.get("bootstrap_room")
        req = SimReq(
            rid=str(rid) if rid else uuid.uuid4().hex,
            input_ids=input_ids,
            max_new_tokens=int(max_new if max_new is not None else 128),
            bootstrap_host=body.get("bootstrap_host"),
            bootstrap_port=int(body["bootstrap_port"]) if body.get("bootstrap_port") is not None else None,
            bootstrap_room=int(room) if room is not None else None,
            caller_tokens=int(input_ids.size),
            return_logprob=body.get("return_logprob") is True,
            top_logprobs_num=_top_num(body.get("top_logprobs_num")),
        )
        return req, bool(body.get("stream", False))

    async def run(req: SimReq, request: Request) -> dict[str, Any]:
        """Run the engine; a client that disconnects aborts its request.

        `TokenizerManager._wait_one_response` checks `request.is_disconnected()` each time its wait
        times out (SGLANG_REQUEST_STATE_WAIT_TIMEOUT, 4 s) and then calls `abort_request`.
        """
        task = asyncio.ensure_future(engine.generate(req))
        poll = env_float("SGLANG_REQUEST_STATE_WAIT_TIMEOUT", 4.0)
        while True:
            done, _ = await asyncio.wait({task}, timeout=poll)
            if done:
                try:
                    return task.result()
                finally:
                    if not task.cancelled():
                        engine.count_finished(req, stream=False)
            if await request.is_disconnected() and isinstance(engine, (DecodeEngine, PrefillEngine)):
                engine.abort(req.rid)

    def shape(result: dict[str, Any]) -> dict[str, Any]:
        """Under --skip-tokenizer-init SGLang answers `output_ids` and no `text` (measured, 0.5.19-0.5.23)."""
        if cfg.skip_tokenizer_init:
            result = {k: v for k, v in result.items() if k != "text"}
        return result

    @app.post("/generate")
    async def _generate(request: Request) -> Response:
        try:
            body = _loads(await request.body())
        except ValueError as exc:
            return _json(
                {
                    "object": "error",
                    "message": f"Invalid JSON: {exc}",
                    "type": "Bad Request",
                    "param": None,
                    "code": 400,
                },
                400,
            )
        try:
            req, stream = parse(body, prompt_key="text")
        except RequestError as exc:
            if body.get("stream"):
                return StreamingResponse(_stream_error(exc.abort), media_type="text/event-stream")
            return error_response(exc.abort)
        if stream:
            return StreamingResponse(_stream(engine, req, shape), media_type="text/event-stream")
        try:
            result = await run(req, request)
        except RequestError as exc:
            return error_response(exc.abort)
        return _json(shape(result))

    @app.post("/v1/completions")
    async def _completions(request: Request) -> Response:
        body = _loads(await request.body())
        try:
            req, _ = parse(body, prompt_key="prompt")
        except RequestError as exc:
            return openai_error(exc.abort)
        if body.get("stream"):
            return StreamingResponse(_completion_stream(engine, req, model_name), media_type="text/event-stream")
        try:
            result = await run(req, request)
        except RequestError as exc:
            return openai_error(exc.abort)
        meta = result["meta_info"]
        fr = meta["finish_reason"] or {}
        return _json(
            {
                "id": meta["id"],
                "object": "text_completion",
                "created": int(time.time()),
                "model": model_name,
                "choices": [
                    {
                        "index": 0,
                        "text": result["text"],
                        "logprobs": None,
                        "finish_reason": fr.get("type"),
                        "matched_stop": fr.get("matched"),
                    }
                ],
                "usage": {
                    "prompt_tokens": meta["prompt_tokens"],
                    "completion_tokens": meta["completion_tokens"],
                    "total_tokens": meta["prompt_tokens"] + meta["completion_tokens"],
                },
            }
        )

    return app


def _sse(obj: Any) -> bytes:
    data = _orjson.dumps(obj) if _orjson is not None else json.dumps(obj).encode()
    return b"data: " + data + b"\n\n"


async def _stream_error(abort: Abort) -> AsyncIterator[bytes]:
    """Streaming `/generate` errors: HTTP 200, an error event, then [DONE]."""
    code = int(abort.status_code)
    yield _sse(
        {
            "error": {
                "message": abort.message,
                "type": "invalid_request_error" if code == 400 else "server_error",
                "code": code,
                "retryable": False,
            }
        }
    )
    yield b"data: [DONE]\n\n"


async def _stream(
    engine: BaseEngine, req: SimReq, shape: Callable[[dict[str, Any]], dict[str, Any]]
) -> AsyncIterator[bytes]:
    """Streaming `/generate`: one event per token with the cumulative text, then [DONE]."""
    queue: asyncio.Queue[bytes | None] = asyncio.Queue()

    async def sink(ids: list[int], text: str) -> None:
        meta = {
            "id": req.rid,
            "finish_reason": None,
            "prompt_tokens": req.caller_tokens,
            "completion_tokens": len(ids),
            "cached_tokens": 0,
        }
        await queue.put(_sse(shape({"text": text, "output_ids": list(ids), "meta_info": meta})))

    async def runner() -> None:
        try:
            if isinstance(engine, DecodeEngine):
                result = await engine.generate(req, sink)
            else:
                result = await engine.generate(req)
            engine.count_finished(req, stream=True)
            await queue.put(_sse(shape(result)))
            await queue.put(b"data: [DONE]\n\n")
        except RequestError as exc:
            engine.count_finished(req, stream=True)
            # An abort from the scheduler reaches a streaming client as a normal chunk, under HTTP 200:
            # nothing generated, the one-token placeholder as prompt_tokens, `finish_reason` the abort
            # (real 0.5.22 through smg 1.13.0, measured by tests/real/test_differential.py). Only the
            # tokenizer's own rejections (`parse`) are `{"error": ...}` events.
            meta = {
                "id": req.rid,
                "finish_reason": exc.abort.finish_reason(),
                "prompt_tokens": 1,
                "completion_tokens": len(exc.output_ids),
                "cached_tokens": 0,
            }
            await queue.put(
                _sse(shape({"text": tokenizer.decode(exc.output_ids), "output_ids": exc.output_ids, "meta_info": meta}))
            )
            await queue.put(b"data: [DONE]\n\n")
        finally:
            await queue.put(None)

    task = asyncio.ensure_future(runner())
    finished = False
    try:
        while True:
            item = await queue.get()
            if item is None:
                finished = True
                return
            yield item
    finally:
        if not finished and isinstance(engine, (DecodeEngine, PrefillEngine)):
            engine.abort(req.rid)  # the client went away mid-stream
        if not finished:
            await asyncio.wait({task}, timeout=5)


async def _completion_stream(engine: BaseEngine, req: SimReq, model: str) -> AsyncIterator[bytes]:
    """Streaming `/v1/completions`: OpenAI chunks with text deltas, then [DONE]; errors as
    `data: <ErrorResponse json>` (`serving_completions._generate_completion_stream`)."""
    created = int(time.time())
    sent = 0

    def chunk(text: str, finish: str | None, usage: dict[str, int] | None = None) -> bytes:
        doc: dict[str, Any] = {
            "id": req.rid,
            "object": "text_completion",
            "created": created,
            "model": model,
            "choices": [{"index": 0, "text": text, "logprobs": None, "finish_reason": finish, "matched_stop": None}],
        }
        if usage is not None:
            doc["usage"] = usage
        return _sse(doc)

    async for event in _stream(engine, req, lambda d: d):
        if event == b"data: [DONE]\n\n":
            yield event
            return
        doc = json.loads(event[len(b"data: ") :])
        fr = (doc.get("meta_info") or {}).get("finish_reason") or {}
        if "error" not in doc and fr.get("type") == "abort" and not doc.get("output_ids"):
            doc = {"error": {"message": fr.get("message", "Aborted"), "code": fr.get("status_code") or 500}}
        if "error" in doc:
            err = doc["error"]
            yield _sse(
                {
                    "object": "error",
                    "message": err["message"],
                    "type": "BadRequestError" if err["code"] == 400 else str(err["code"]),
                    "param": None,
                    "code": err["code"],
                }
            )
            continue
        text = doc["text"]
        meta = doc["meta_info"]
        finish = (meta.get("finish_reason") or {}).get("type")
        if text[sent:] or finish:
            usage = (
                {
                    "prompt_tokens": meta["prompt_tokens"],
                    "completion_tokens": meta["completion_tokens"],
                    "total_tokens": meta["prompt_tokens"] + meta["completion_tokens"],
                }
                if finish
                else None
            )
            yield chunk(text[sent:], finish, usage)
            sent = len(text)


async def serve(engine: BaseEngine) -> None:
    """Start the engine (bootstrap server on prefill) and serve HTTP until cancelled."""
    import uvicorn

    app = build_app(engine)
    await engine.start()
    config = uvicorn.Config(
        app,
        host=engine.cfg.host,
        port=engine.cfg.port,
        log_level="warning",
        access_log=False,
        lifespan="off",
        timeout_keep_alive=75,
        timeout_graceful_shutdown=1,
    )
    server = uvicorn.Server(config)
    try:
        await server.serve()
    finally:
        await engine.stop()

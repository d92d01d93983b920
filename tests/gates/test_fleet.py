"""The fleet gate's consistency checks, run through the real CLI against loopback workers."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from typer.testing import CliRunner

from kvgate.cli import app
from kvgate.exitcodes import ExitStatus
from tests.assets import sglang_payloads as P
from tests.conftest import PayloadServer, Route

runner = CliRunner()
BIG = 2_040_000


def worker(
    make: Callable[..., PayloadServer], mode: str, context: int = 1_048_576, pool: int = BIG, **kw: Any
) -> PayloadServer:
    return make(
        {
            "/server_info": Route(P.server_info("0.5.22", mode=mode, context=context, pool=pool, **kw)),
            "/v1/models": Route(P.v1_models(context)),
            "/model_info": Route(P.model_info("0.5.22", mode)),
        }
    )


def fleet_failures(*args: str) -> tuple[int, list[tuple[str, str]]]:
    res = runner.invoke(app, ["check", "--quiet", "--format", "json", "--trust-version", "--no-strict", *args])
    bad = [
        (f["check"], f["node"])
        for f in json.loads(res.stdout)["findings"]
        if f["gate"] == "fleet" and f["outcome"] == "failed"
    ]
    return res.exit_code, bad


def test_the_decode_off_the_fleets_context_is_named(payload_server: Callable[..., PayloadServer]) -> None:
    p = worker(payload_server, "prefill")
    d0 = worker(payload_server, "decode")
    d1 = worker(payload_server, "decode", context=524_288)
    code, bad = fleet_failures("--prefill-url", p.url, "--decode-url", d0.url, "--decode-url", d1.url)
    assert code == ExitStatus.GATE_FAILED
    assert bad == [("context-consistency", f"decode[1] {d1.url}")]


def test_a_one_to_one_disagreement_names_both(payload_server: Callable[..., PayloadServer]) -> None:
    p = worker(payload_server, "prefill", page_size=64)
    d = worker(payload_server, "decode", page_size=16)
    code, bad = fleet_failures("--prefill-url", p.url, "--decode-url", d.url)
    assert code == ExitStatus.GATE_FAILED
    assert sorted(bad) == [
        ("page-size-consistency", f"decode[0] {d.url}"),
        ("page-size-consistency", f"prefill[0] {p.url}"),
    ]


def test_the_prefill_that_admits_less_is_named(payload_server: Callable[..., PayloadServer]) -> None:
    ps = [worker(payload_server, "prefill") for _ in range(3)]
    small = worker(payload_server, "prefill", pool=1_400_000)  # passes headroom x1.25 alone, admits the same
    tiny = worker(payload_server, "prefill", pool=900_000)
    args = [a for s in ps + [small, tiny] for a in ("--prefill-url", s.url)]
    code, bad = fleet_failures(*args)
    assert bad == [("prefill-admission-consistency", f"prefill[4] {tiny.url}")]
    assert code == ExitStatus.GATE_FAILED


def test_pools_that_differ_above_the_context_do_not_block(payload_server: Callable[..., PayloadServer]) -> None:
    # Real pools differ by the GPU memory left after the weights; above the context they admit alike.
    a = worker(payload_server, "prefill", pool=BIG)
    b = worker(payload_server, "prefill", pool=BIG - 4_096)
    d = worker(payload_server, "decode")
    res = runner.invoke(
        app,
        [
            "check",
            "--quiet",
            "--format",
            "json",
            "--trust-version",
            "--no-strict",
            "--prefill-url",
            a.url,
            "--prefill-url",
            b.url,
            "--decode-url",
            d.url,
        ],
    )
    assert res.exit_code == ExitStatus.PASSED, res.output
    adm = [f for f in json.loads(res.stdout)["findings"] if f["check"] == "prefill-admission-consistency"]
    assert len(adm) == 1 and adm[0]["outcome"] == "passed" and "2,035,904 .. 2,040,000" in adm[0]["summary"]

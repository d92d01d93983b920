"""What several nodes say alike is printed once, naming the nodes (issue 23: `defenses.release` repeated
~25 identical lines per node). The machine formats keep one finding per node."""

from __future__ import annotations

import json
import re
from collections.abc import Callable

from typer.testing import CliRunner

from kvgate.cli import app
from tests.assets import sglang_payloads as P
from tests.conftest import PayloadServer, Route

runner = CliRunner()


def worker(make: Callable[..., PayloadServer], version: str, mode: str) -> PayloadServer:
    return make(
        {
            "/server_info": Route(P.server_info(version, mode=mode, context=1_048_576, pool=2_040_000)),
            "/v1/models": Route(P.v1_models(1_048_576)),
            "/model_info": Route(P.model_info(version, mode)),
        }
    )


def test_identical_release_findings_print_once_with_their_nodes(payload_server: Callable[..., PayloadServer]) -> None:
    same = [worker(payload_server, "0.5.22", "prefill") for _ in range(4)]
    odd = worker(payload_server, "0.5.20", "decode")
    args = ["check", "-q", *(a for w in same for a in ("--prefill-url", w.url)), "--decode-url", odd.url]
    table = runner.invoke(app, args).stdout
    detail = table.split("detail (", 1)[1]
    assert detail.count("INCONCLUSIVE defenses.release") == 1
    assert "defenses.release 4 nodes: prefill[0]" in " ".join(detail.split())
    for w in same:
        assert w.url in detail
    assert detail.count("- pr-38935 = present") == 1  # the ~25 lines once, not once per node
    assert detail.count("FAIL defenses.release decode[0]") == 1  # a different verdict stays apart
    markdown = runner.invoke(app, [*args, "-f", "markdown"]).stdout
    # as a Markdown reader sees it: server text (URLs, brackets) is backslash-escaped (kvgate/output/sinks.py)
    evidence = re.sub(r"\\(.)", r"\1", markdown.split("### Evidence", 1)[1].split("###", 1)[0])
    assert evidence.count("**defenses.release** (4 nodes: prefill[0]") == 1
    doc = json.loads(runner.invoke(app, [*args, "-f", "json"]).stdout)
    per_node = [f for f in doc["findings"] if f["check"] == "release"]
    assert len(per_node) == 5  # JSON keeps one finding per node

"""check's exit 3 for lack of evidence names, on its first screen, the command line that makes the evidence."""

from __future__ import annotations

import json
import os
import shlex
from pathlib import Path

import pytest
from typer.testing import CliRunner

from kvgate.cli import app
from kvgate.commands.nextstep import pod_template
from kvgate.exitcodes import ExitStatus
from tests.catalogue.helpers import wheel
from tests.commands.test_check_code import worker

pytestmark = pytest.mark.wheels
runner = CliRunner()
STANDIN = Path(__file__).resolve().parents[1] / "assets" / "standin"  # a TEST STAND-IN for kubectl
PREFIX = "to turn this into evidence, run: "


def test_the_pod_template_comes_from_the_service_names() -> None:
    svc = "http://glm-{}-{}.glm-{}.llm-serving.svc.cluster.local:30000"
    prefill = tuple(svc.format("prefill", i, "prefill") for i in range(2))
    decode = (svc.format("decode", 0, "decode"),)
    assert pod_template(prefill, decode) == "kubectl exec -i -n llm-serving glm-{role}-{index} -c sglang -- python3"
    # addresses that name no pod: placeholders to fill, never a guess
    assert "-n NAMESPACE {role}-{index}" in pod_template(("http://10.0.0.7:30000",), ())


def test_exit_3_for_a_version_string_names_the_command_that_reads_the_code(payload_server, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    p, d = worker(payload_server, "0.5.22"), worker(payload_server, "0.5.22", "decode")
    argv = ["check", "-q", "--prefill-url", p.url, "--decode-url", d.url]
    res = runner.invoke(app, argv, terminal_width=100, env={"COLUMNS": "100"})
    assert res.exit_code == ExitStatus.INCONCLUSIVE, res.output
    first_screen = res.stdout.split("\ndetail")[0]
    (line,) = [ln for ln in first_screen.splitlines() if ln.startswith(PREFIX)]
    suggested = shlex.split(line.removeprefix(PREFIX))
    assert suggested[:2] == ["kvgate", "check"] and suggested[2:7] == argv[1:]
    assert "--python" in suggested and "--router-url" in suggested  # the code, and the probes' router
    # The suggestion really makes the evidence: its --python template, through the kubectl stand-in,
    # reads each node's code (a router is not there to add, so that part is left out here).
    python = suggested[suggested.index("--python") + 1]
    log = tmp_path / "kubectl.log"
    env = {
        "PATH": f"{STANDIN}{os.pathsep}{os.environ['PATH']}",
        "KVGATE_TEST_SGLANG_SITE": str(wheel("0.5.22")),
        "KVGATE_TEST_KUBECTL_LOG": str(log),
    }
    out = runner.invoke(app, [*argv, "--python", python, "-f", "json"], env=env)
    doc = json.loads(out.stdout)
    release = [f for f in doc["findings"] if f["gate"] == "defenses" and f["check"] == "release"]
    assert release and all(f["outcome"] == "passed" for f in release), release
    assert len(log.read_text().splitlines()) == 2  # one scan per node, each in its own pod

"""action.yml (the composite GitHub Action): its steps' commands run with bash as a runner runs them
(`bash --noprofile --norc -eo pipefail`, GITHUB_OUTPUT / GITHUB_STEP_SUMMARY / RUNNER_TEMP set, inputs
passed the way the action passes them) against a fake deployment on real sockets."""

from __future__ import annotations

import json
import os
import re
import stat
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

import tests.assets.sglang_payloads as P
from tests.conftest import PayloadServer, Route

ROOT = Path(__file__).resolve().parent.parent
ACTION = ROOT / "action.yml"
EXPR = re.compile(r"\$\{\{\s*([^}]+?)\s*\}\}")


def action() -> dict[str, Any]:
    return yaml.safe_load(ACTION.read_text())


def run_action(inputs: dict[str, str], workdir: Path, env: dict[str, str] | None = None) -> dict[str, Any]:
    """Run every step of the action in order; return the last step's status, stdout, outputs and summary."""
    spec = action()
    unknown = set(inputs) - set(spec["inputs"])
    assert not unknown, f"not inputs of action.yml: {unknown}"
    values = {k: inputs.get(k, v.get("default", "")) for k, v in spec["inputs"].items()}
    summary = workdir / "step-summary.md"
    summary.touch()
    outputs: dict[str, dict[str, str]] = {}
    base_env = {
        **os.environ,
        **(env or {}),
        "GITHUB_STEP_SUMMARY": str(summary),
        "RUNNER_TEMP": str(workdir / "runner-temp"),
        "GITHUB_ACTION_PATH": str(ROOT),
    }
    (workdir / "runner-temp").mkdir(exist_ok=True)

    def resolve(text: str) -> str:
        def one(m: re.Match[str]) -> str:
            expr = m.group(1)
            if expr.startswith("inputs."):
                return values[expr.removeprefix("inputs.")]
            if expr == "github.action_path":
                return str(ROOT)
            step_out = re.fullmatch(r"steps\.([\w-]+)\.outputs\.([\w-]+)", expr)
            if step_out:
                return outputs.get(step_out.group(1), {}).get(step_out.group(2), "")
            raise AssertionError(f"action.yml uses an expression this test does not know: {expr}")

        return EXPR.sub(one, text)

    result: dict[str, Any] = {}
    log = ""  # the job log: every step's output
    for i, step in enumerate(spec["runs"]["steps"]):
        assert step["shell"] == "bash" and "uses" not in step, step  # it uploads nothing itself
        assert "${{" not in step["run"], "inputs reach the scripts through env, never pasted into them"
        out_file = workdir / f"output-{i}"
        out_file.touch()
        script = workdir / f"step-{i}.sh"
        script.write_text(step["run"])
        step_env = {**base_env, **{k: resolve(str(v)) for k, v in step.get("env", {}).items()}}
        step_env["GITHUB_OUTPUT"] = str(out_file)
        proc = subprocess.run(
            ["bash", "--noprofile", "--norc", "-eo", "pipefail", str(script)],
            capture_output=True,
            text=True,
            env=step_env,
            cwd=workdir,
            timeout=600,
        )
        outputs[step.get("id", f"step{i}")] = dict(
            line.split("=", 1) for line in out_file.read_text().splitlines() if "=" in line
        )
        log += proc.stdout
        result = {"status": proc.returncode, "stdout": log, "stderr": proc.stderr}
        if proc.returncode != 0 and i < len(spec["runs"]["steps"]) - 1:
            break  # a runner stops at a failed step
    result["outputs"] = outputs
    result["summary"] = summary.read_text()
    return result


def kvgate_wrapper(tmp_path: Path) -> Path:
    """This checkout's kvgate as an executable (the action's `kvgate` input), instead of building the file."""
    exe = tmp_path / "kvgate"
    exe.write_text(f'#!/bin/sh\nexec "{sys.executable}" -c "from kvgate.cli import main; main()" "$@"\n')
    exe.chmod(exe.stat().st_mode | stat.S_IEXEC)
    return exe


def worker(payload_server: Callable[..., PayloadServer], **kw: Any) -> PayloadServer:
    return payload_server({"/server_info": Route(P.server_info(**kw)), "/v1/models": Route(P.v1_models())})


def test_action_is_a_composite_with_the_checks_inputs() -> None:
    spec = action()
    assert spec["runs"]["using"] == "composite"
    assert {"prefill-urls", "decode-urls", "router-url", "profile", "token-env", "strict", "args"} <= set(
        spec["inputs"]
    )
    assert "exit-code" in spec["outputs"]


def test_a_failing_gate_annotates_summarises_and_exits_1(
    tmp_path: Path, payload_server: Callable[..., PayloadServer]
) -> None:
    """The incident's pool (681,280 < 1.25 x 1,048,576): exit 1, one ::error per failed/inconclusive finding."""
    srv = worker(payload_server, version="0.5.20")
    res = run_action(
        {"prefill-urls": srv.url, "kvgate": str(kvgate_wrapper(tmp_path)), "args": "--no-probes -q"},
        tmp_path,
        env={"PYTHONPATH": str(ROOT)},
    )
    assert res["status"] == 1, res
    assert res["outputs"]["gate"]["exit-code"] == "1"
    doc = json.loads((tmp_path / "kvgate-reports" / "kvgate.json").read_text())
    assert doc["verdict"] == "gate_failed"
    act_on = [f for f in doc["findings"] if f["outcome"] in ("failed", "error", "inconclusive") and not f["waived"]]
    notes = [ln for ln in res["stdout"].splitlines() if ln.startswith(("::error", "::warning"))]
    assert len(notes) == len(act_on) > 0, notes
    assert any(ln.startswith("::error title=pool-context.headroom::") for ln in notes), notes
    assert "kvgate check: GATE FAILED" in res["summary"]
    sarif = json.loads((tmp_path / "kvgate-reports" / "kvgate.sarif").read_text())
    assert any(r["ruleId"] == "pool-context.headroom" for r in sarif["runs"][0]["results"])
    assert (tmp_path / "kvgate-reports" / "kvgate.xml").is_file()


def test_a_usage_error_still_reports_and_exits_2(tmp_path: Path) -> None:
    res = run_action(
        {"prefill-urls": "ftp://nope", "kvgate": str(kvgate_wrapper(tmp_path))}, tmp_path, {"PYTHONPATH": str(ROOT)}
    )
    assert res["status"] == 2, res
    assert "::error title=kvgate.run::" in res["stdout"]
    assert "USAGE ERROR" in res["summary"]


def test_a_bad_strict_input_is_a_usage_error(tmp_path: Path) -> None:
    res = run_action({"strict": "maybe", "kvgate": str(kvgate_wrapper(tmp_path))}, tmp_path)
    assert res["status"] == 2 and "input strict must be" in res["stdout"], res


@pytest.mark.slow
def test_the_action_builds_the_file_and_passes_a_healthy_deployment(
    tmp_path: Path, payload_server: Callable[..., PayloadServer]
) -> None:
    """Every step as written, the build included: a healthy pool on 0.5.22 exits 0 with no annotation."""
    srv = worker(payload_server, version="0.5.22", pool=2_040_000)
    res = run_action(
        {"prefill-urls": srv.url, "strict": "false", "args": "--no-probes --trust-version"},
        tmp_path,
    )
    assert res["status"] == 0, res
    assert Path(res["outputs"]["build"]["kvgate"]).is_file()
    assert not [ln for ln in res["stdout"].splitlines() if ln.startswith("::error")], res["stdout"]
    assert "kvgate check: PASSED" in res["summary"]


def test_annotations_escape_what_github_would_read_as_commands() -> None:
    sys.path.insert(0, str(ROOT / "tools"))
    try:
        import gha_report
    finally:
        sys.path.remove(str(ROOT / "tools"))
    doc = {
        "strict": False,
        "findings": [
            {"id": "a.b", "outcome": "failed", "node": "n", "summary": "50%\nx", "waived": None},
            {"id": "c.d", "outcome": "inconclusive", "node": "n", "summary": "s", "waived": None},
            {"id": "e.f", "outcome": "failed", "node": "n", "summary": "s", "waived": "until 2026-12-31"},
            {"id": "g.h", "outcome": "passed", "node": "n", "summary": "s", "waived": None},
        ],
    }
    lines = gha_report.annotations(doc)
    # %-escaped as the runner unescapes; a line break in server text is shown, never a second line
    assert lines[0] == "::error title=a.b::n: failed: 50%25\\x0ax"
    assert lines[1].startswith("::warning title=c.d::")  # strictness opted out: it did not block
    assert len(lines) == 2

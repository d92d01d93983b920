"""README.md, docs/usage.md, docs/reference.md and examples/ cannot drift: every `kvgate` command they
show is accounted for.

Each command line shown in a code block of those pages or in examples/ is either
- RUN here, in-process, with its documented exit code and the lines the text quotes asserted (RUNS;
  the quoted lines must be in those pages too, so text and test cannot part), or
- REAL: it needs the real SGLang server on CPU; tests/real/test_readme_real.py runs it in the real tier, or
- marked, by a rule anyone adding a section gets for free, as needing what this machine has not got:
  a running deployment (a URL that is not local), the operator's files or cluster (a path or a
  `kubectl` that is not in this repository), GPUs, or a server that runs until stopped.
Marked commands are still parsed by kvgate's CLI (tests/test_cli_surface.py, tests/test_examples.py).
A command that fits no rule and has no RUNS entry fails here: add it to RUNS with what the text says.
"""

from __future__ import annotations

import json
import re
import shlex
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlparse

import pytest
import tomllib
from typer.testing import CliRunner

from kvgate.cli import app
from tests.test_examples import example_commands, shell_commands

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
# The pages whose commands are tested: the README (quick start) and what moved out of it to docs/.
DOCS = (README, ROOT / "docs" / "usage.md", ROOT / "docs" / "reference.md")


def docs_text() -> str:
    return "\n".join(p.read_text() for p in DOCS)


runner = CliRunner()


def readme_commands() -> list[tuple[str, list[str]]]:
    """(source, argv) of every kvgate command in the DOCS pages' shell/console blocks and in examples/."""
    out: list[tuple[str, list[str]]] = []
    for page in DOCS:
        for block in re.findall(r"```(?:bash|sh|console|shell)\n(.*?)```", page.read_text(), flags=re.S):
            text = "\n".join(line.strip().removeprefix("$ ") for line in block.splitlines())
            out += [(str(page.relative_to(ROOT)), argv) for argv in shell_commands(text)]
    return out + example_commands()


def key(argv: list[str]) -> str:
    return shlex.join(argv)


# --- what cannot run here, by rule -------------------------------------------------------------------------
LOCAL = {"127.0.0.1", "localhost"}
URL_FLAGS = {"--prefill-url", "--decode-url", "--router-url", "--url"}
OPERATOR_PATHS = ("~/", "/opt/", "/mnt/", "/etc/kvgate/", "$")


def why_not_here(argv: list[str]) -> str | None:
    """Why this command cannot run on this machine, or None when it must run here."""
    words = set(argv)
    if ("--engine" in words and argv[argv.index("--engine") + 1] == "sglang") or (
        argv[:1] == ["up"] and "--device" in words
    ):
        return "real"  # the real SGLang server on CPU: tests/real/test_readme_real.py
    if argv[:1] == ["up"] and "--engine" not in words:
        return "gpu: real SGLang workers on GPUs"
    if argv[:2] == ["sim", "up"]:
        return "server: runs until Ctrl-C (tests/sim/test_cli_up.py starts and stops it)"
    for flag, value in zip(argv, argv[1:], strict=False):
        if flag in URL_FLAGS and urlparse(value.replace("${{", "").replace("}}", "")).hostname not in LOCAL:
            return "deployment: a running deployment at a URL that is not on this machine"
    for a in argv:
        if a.startswith(OPERATOR_PATHS) or a.startswith("kubectl ") or a == "config.json":
            return f"environment: the operator's {a!r}, not in this repository"
    return None


# --- what runs here ----------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Expect:
    """The documented exit code(s), where README.md says it, and the lines it quotes (verbatim)."""

    exit: tuple[int, ...]
    says: str  # the README.md phrase that documents the exit code
    quoted: tuple[str, ...] = ()  # lines README.md quotes that the output must contain verbatim
    headlines: tuple[str, ...] = ()  # `FAIL <check ID>` headlines the quoted report shows (ports vary)
    slow: bool = False


PLAN = (
    "plan --model-config tests/plan/model_configs/deepseek-v32-dsa.json --gpu-memory-gib 139.5 --gpus-per-worker 8 "
    "--tp 8 --mem-fraction-static 0.85 --page-size 64 --context-length 1048576 --weights-gib 68.88 --release 0.5.22 "
    "--format markdown"
)
RUNS: dict[str, Expect] = {
    "drill --release 0.5.19": Expect(
        (1,),
        "The gate must fail (exit 1)",
        quoted=("kvgate drill: GATE FAILED: do not promote (exit 1)",),
        headlines=(
            "FAIL probes.canary.round_a",
            "FAIL probes.contract.pool_limit",
            "FAIL probes.contract.reject_band_middle",
            "FAIL pool-context.headroom",
            "FAIL defenses.release",
            "FAIL defenses.deferred-release",
        ),
        slow=True,
    ),
    "schema": Expect((0,), "The JSON report's schema is published"),
    PLAN: Expect(
        (1,),
        "the plan exits 1",
        quoted=(
            "| FAIL | `plan.pool` | prefill (planned) | SGLang 0.5.22 sizes 681,216 tokens \\< 1,310,720 required for "
            "context 1,048,576; over-pool band (681,216, 1,048,576\\] |",
            "- **plan.pool** (2 nodes\\: prefill (planned), decode (planned)): any one of\\: "
            "--tp 8 -\\> 32 (pool 1,389,440; 32 GPUs per worker; "
            "weights assumed to split evenly; MLA/DSA cells do not shrink with TP, only the weights do); "
            "--context-length 1048576 -\\> 544972 (pool 681,216; advertise this context instead (longer prompts then "
            "get an explicit 400)); --gpus-per-worker 8 -\\> 16 (pool 2,269,568; as pipeline stages (--pp 2) at tp 8; "
            "weights assumed to split evenly). Not by\\: --mem-fraction-static (even 0.99 gives 948,992 tokens); "
            "--kv-cache-dtype (fp8\\_e4m3 gives 1,110,080 tokens); --page-size (page rounding costs under 64 tokens; "
            "page 1 gives 681,267 tokens) (see `docs/checks.md#plan`)",
        ),
    ),
    "check --headroom -1 --format json --output r.json": Expect((2,), "# exit 2; r.json has verdict usage_error"),
    "fixes --release 0.5.20": Expect((1,), "Exit 1 when a correctness fix is missing"),
    # The simulator emulating a healthy 0.5.22: never blocked; 3 only where the 8k context is too short for
    # the latency probe to observe anything (strict by default), as the README says of inconclusive checks.
    "up --engine sim --release 0.5.22 --gate": Expect(
        (0, 3), "with `--gate` gates them and exits with the gate's status", slow=True
    ),
    "--version": Expect((0,), "RUN kvgate --version"),
    # Run on a cache folder of the test's own (below), never the shared one.
    "cache": Expect((0,), "See and clear the cache"),
    "cache --clear --entry unpacked": Expect((0,), "deletes it (links as links, nothing outside it)"),
    "watch --help": Expect((0,), "kvgate watch --help"),
}


def runnable() -> list[tuple[str, list[str]]]:
    return [(src, argv) for src, argv in readme_commands() if why_not_here(argv) is None]


def test_every_command_shown_is_run_or_marked() -> None:
    commands = readme_commands()
    assert len(commands) >= 30, commands
    unaccounted = [f"{src}: kvgate {key(argv)}" for src, argv in runnable() if key(argv) not in RUNS]
    assert not unaccounted, "commands shown but neither run nor marked (add them to RUNS):\n" + "\n".join(unaccounted)
    shown = {key(argv) for _, argv in commands}
    stale = sorted(set(RUNS) - shown)
    assert not stale, f"RUNS entries no longer shown anywhere: {stale}"


def test_the_real_tier_runs_every_real_command() -> None:
    from tests.real.test_readme_real import REAL_COMMANDS

    real = {key(argv) for _, argv in readme_commands() if why_not_here(argv) == "real"}
    assert real and real == set(REAL_COMMANDS), (real, set(REAL_COMMANDS))


def test_the_rules_mark_what_they_should() -> None:
    assert why_not_here(["check", "--router-url", "http://router:8000"]).startswith("deployment")  # type: ignore[union-attr]
    assert why_not_here(["check", "--router-url", "http://127.0.0.1:8000"]) is None
    assert why_not_here(["fixes", "--repo", "~/src/sglang"]).startswith("environment")  # type: ignore[union-attr]
    assert why_not_here(["fixes", "--release", "0.5.20"]) is None


def _params() -> list[object]:
    out: list[object] = []
    for k, e in RUNS.items():
        out.append(pytest.param(k, e, id=k[:60], marks=[pytest.mark.slow] if e.slow else []))
    return out


@pytest.mark.parametrize(("command", "expect"), _params())
def test_shown_command_does_what_the_text_says(
    command: str, expect: Expect, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    text = docs_text() + "".join(p.read_text() for p in (ROOT / "examples").rglob("Dockerfile"))
    assert expect.says in " ".join(text.split()), f"the text no longer says {expect.says!r}"
    for line in expect.quoted:
        assert line in text, f"the text no longer quotes {line!r}"
    for h in expect.headlines:
        assert h in docs_text(), f"the README's report no longer shows {h!r}"
    argv = shlex.split(command)
    if argv[:1] != ["--version"] and argv[:1] != ["schema"]:
        argv += [] if "-q" in argv else ["-q"]
    monkeypatch.chdir(tmp_path if "tests/" not in command else ROOT)
    if argv[:1] == ["cache"]:  # its own cache: `--clear` must never touch the shared one
        (tmp_path / "cache" / "unpacked" / "sglang-0.5.22").mkdir(parents=True)
        monkeypatch.setenv("KVGATE_CACHE_DIR", str(tmp_path / "cache"))
    res = runner.invoke(app, argv, terminal_width=100, env={"COLUMNS": "100"})
    assert res.exit_code in expect.exit, res.output
    for line in expect.quoted:
        assert line in res.stdout, f"`kvgate {command}` no longer prints {line!r}:\n{res.stdout[-3000:]}"
    for h in expect.headlines:
        assert re.search(rf"^{re.escape(h)} ", res.stdout, flags=re.M), f"no headline {h!r}:\n{res.stdout[:3000]}"
    if command == "schema":
        json.loads(res.stdout)
    if "--output" in argv:
        out = tmp_path / argv[argv.index("--output") + 1]
        assert json.loads(out.read_text())["verdict"] == "usage_error"


def test_no_install_of_the_quick_start_pulls_torch() -> None:
    """Copied top to bottom on an ordinary Linux host, the quick start must not pull torch's CUDA build
    (gigabytes): neither kvgate nor any of its extras asks for torch, torchvision or xgrammar (the
    simulator's pool is numpy; the real tier's release environments pin their own CPU torch)."""
    meta = tomllib.loads((README.parent / "pyproject.toml").read_text())["project"]
    wanted = [*meta["dependencies"], *(r for reqs in meta["optional-dependencies"].values() for r in reqs)]
    names = {re.split(r"[\[<>=!~; ]", r, maxsplit=1)[0].lower() for r in wanted}
    assert not names & {"torch", "torchvision", "xgrammar"}, sorted(names)
    assert "pip install torch" not in README.read_text()

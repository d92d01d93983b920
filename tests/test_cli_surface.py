"""The CLI surface: --help never imports heavy dependencies; README usage matches the live --help."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

from typer.testing import CliRunner

from kvgate.cli import app

ROOT = Path(__file__).resolve().parent.parent
runner = CliRunner()


def _commands() -> list[list[str]]:
    """Every command path of the CLI (top level, subcommands and sub-apps' commands)."""
    import typer.main

    group = typer.main.get_command(app)
    paths: list[list[str]] = [[]]

    def walk(cmd, prefix: list[str]) -> None:  # type: ignore[no-untyped-def]
        for name, sub in getattr(cmd, "commands", {}).items():
            paths.append(prefix + [name])
            walk(sub, prefix + [name])

    walk(group, [])
    return paths


def test_help_of_every_command_imports_no_heavy_module() -> None:
    code = (
        "import sys\n"
        "from typer.testing import CliRunner\n"
        "from kvgate.cli import app\n"
        f"for path in {_commands()!r}:\n"
        "    r = CliRunner().invoke(app, path + ['--help'])\n"
        "    assert r.exit_code == 0, (path, r.output)\n"
        "heavy = [m for m in ('torch', 'fastapi', 'uvicorn', 'sglang', 'smg', 'git', 'httpx',\n"
        "                     'kvgate.reading.target', 'kvgate.pipeline.check', 'kvgate.backport.engine',\n"
        "                     'kvgate.catalogue') if m in sys.modules]\n"
        "print('HEAVY', heavy)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "HEAVY []" in out.stdout, out.stdout


def test_help_of_every_command_is_readable_at_80_columns() -> None:
    import typer.main

    group = typer.main.get_command(app)
    for path in _commands():
        res = runner.invoke(app, path + ["--help"], terminal_width=80, env={"COLUMNS": "80"})
        assert res.exit_code == 0, (path, res.output)
        too_wide = [ln for ln in res.output.splitlines() if len(ln) > 80]
        assert not too_wide, (path, too_wide)
        cmd = group
        for name in path:
            cmd = cmd.commands[name]  # type: ignore[attr-defined]
        for param in cmd.params:
            if getattr(param, "hidden", False):
                continue  # a deprecated spelling, kept working but not shown
            for opt in param.opts + param.secondary_opts:
                assert opt in res.output, f"`kvgate {' '.join(path)} --help` cuts off {opt}"


def _readme_invocations() -> list[list[str]]:
    from tests.test_readme_drift import docs_text

    text = docs_text()  # the README and the pages that moved out of it to docs/
    blocks = re.findall(r"```(?:console|bash|sh|shell)\n(.*?)```", text, flags=re.S)
    calls = []
    for block in blocks:
        joined = block.replace("\\\n", " ")
        for line in joined.splitlines():
            line = line.strip().lstrip("$ ").strip()
            m = re.search(r"(?:^|\s|/)kvgate\s+(.*)$", line)
            if m:
                calls.append(m.group(1).split())
    return calls


def test_readme_usage_matches_live_help() -> None:
    calls = _readme_invocations()
    assert calls, "README shows no kvgate invocation"
    paths = {tuple(p) for p in _commands()}
    for argv in calls:
        words = [w for w in argv if not w.startswith("-")]
        path: list[str] = []
        for w in words:
            if tuple(path + [w]) in paths:
                path.append(w)
            else:
                break
        res = runner.invoke(app, path + ["--help"], terminal_width=200)
        assert res.exit_code == 0, (argv, res.output)
        for flag in (a.split("=")[0] for a in argv if a.startswith("--")):
            assert flag in res.output, f"README uses `kvgate {' '.join(path)} {flag}` but --help does not list it"


def test_ci_runs_exactly_the_readme_test_command() -> None:
    """README's block (install, static checks, tests) is what .ci/run ends with, line for line."""
    readme = (ROOT / "README.md").read_text()
    section = readme.split("Set up and run the test suite", 1)[1]
    block = re.search(r"```bash\n(.*?)\n```", section, flags=re.S).group(1).strip()  # type: ignore[union-attr]
    commands = [ln.strip() for ln in block.splitlines()]
    ci = [ln.strip() for ln in (ROOT / ".ci" / "run").read_text().splitlines() if ln.strip() and not ln.startswith("#")]
    assert ci[-len(commands) :] == commands
    assert commands[-1].startswith(".venv/bin/pytest -q")  # the tests come last, after install and checks
    assert any("pip install" in c for c in commands)
    assert {".venv/bin/ruff check .", ".venv/bin/ruff format --check .", ".venv/bin/mypy"} <= set(commands)
    # Under `set -e` a failure before the last command of an && list does not stop the script: a lint
    # error once let CI go on to the tests and pass. Each check is its own line.
    assert (ROOT / ".ci" / "run").read_text().count("set -euo pipefail") == 1
    assert not [c for c in commands if "&&" in c and ("ruff" in c or "mypy" in c or "pytest" in c)], commands
    assert not [ln for ln in ci if "export " in ln or "=" in ln.split()[0]], "CI must not change the environment"


def test_usage_errors_read_the_same_in_every_command(tmp_path: Path) -> None:
    """A usage error found after the flags parse: `kvgate: error: ...` on stderr, exit 2, and the report."""
    cases = [["check", "--prefill-url", "ftp://x"], ["fixes", "--rev", "HEAD"], ["backport", "--release", "v0.5.20"]]
    for argv in cases:
        out = tmp_path / f"{argv[0]}.json"
        res = runner.invoke(
            app,
            [*argv, "-q", "-f", "json", "-o", str(out)]
            if argv[0] == "check"
            else [*argv, "-f", "json", "-o", str(out)],
        )
        assert res.exit_code == 2, (argv, res.output)
        assert res.stderr.startswith("kvgate: error: ") and "Traceback" not in res.output, (argv, res.stderr)
        doc = json.loads(out.read_text())
        assert doc["verdict"] == "usage_error" and [f["id"] for f in doc["findings"]] == ["kvgate.run"], argv
        assert res.stdout.startswith(f"kvgate {doc['command']}: USAGE ERROR"), (argv, res.stdout)


def test_usage_errors_exit_2_without_a_traceback_in_every_command() -> None:
    cases = [
        ["check", "--prefill-url", "http://x", "-o", "a", "-o", "b"],
        ["fixes", "--release", "0.5.20", "-o", "a", "-o", "b"],
        ["backport", "--release", "v0.5.20", "-o", "a", "-o", "b"],
    ]
    for argv in cases:
        res = runner.invoke(app, argv)
        assert res.exit_code == 2, (argv, res.output)
        assert "Traceback" not in res.output and "--output" in res.stderr


def _leaf_commands() -> list[list[str]]:
    """Every command that runs something (not a group)."""
    import typer.main

    group = typer.main.get_command(app)
    leaves = []
    for path in _commands():
        cmd = group
        for name in path:
            cmd = cmd.commands[name]  # type: ignore[attr-defined]
        if path and not hasattr(cmd, "commands"):
            leaves.append(path)
    return leaves


def test_every_command_takes_quiet() -> None:
    """`-q` is accepted by every command (issue 23): a pipeline can silence progress the same way everywhere."""
    import typer.main

    group = typer.main.get_command(app)
    leaves = _leaf_commands()
    assert {"check", "fixes", "backport", "plan", "drill", "up", "schema"} <= {p[0] for p in leaves}
    for path in leaves:
        cmd = group
        for name in path:
            cmd = cmd.commands[name]  # type: ignore[attr-defined]
        opts = {o for p in cmd.params for o in p.opts}
        assert {"-q", "--quiet"} <= opts, path


def test_quiet_fixes_prints_no_progress_and_the_same_report() -> None:
    loud = runner.invoke(app, ["fixes", "--release", "0.5.22"])
    quiet = runner.invoke(app, ["fixes", "--release", "0.5.22", "-q"])
    assert loud.exit_code == quiet.exit_code == 0
    assert quiet.stderr == "" and quiet.stdout.splitlines()[0] == loud.stdout.splitlines()[0]


def test_a_flag_validation_error_writes_every_requested_report(tmp_path: Path) -> None:
    """`--headroom -1 --format json --output r.json` (issue 23): exit 2, r.json written with the usage-error
    verdict, the error printed once on stderr, as a profile error does; the other formats too."""
    out, junit = tmp_path / "r.json", tmp_path / "r.xml"
    res = runner.invoke(
        app, ["check", "--headroom", "-1", "--format", "json", "--output", str(out), "-f", "junit", "-o", str(junit)]
    )
    assert res.exit_code == 2, res.output
    doc = json.loads(out.read_text())
    assert doc["verdict"] == "usage_error" and doc["exit_status"] == 2
    assert "--headroom" in doc["findings"][0]["summary"]
    assert "<testsuites" in junit.read_text()
    assert res.stderr.count("--headroom") == 1 and res.stderr.startswith("kvgate: error: ")
    assert "Try 'kvgate check --help'" in res.stderr and "Traceback" not in res.output
    # The table says it once too: the verdict, then the error (no detail section repeating it).
    assert res.stdout.count("--headroom") == 1, res.stdout


def test_flag_errors_report_in_every_reporting_command(tmp_path: Path) -> None:
    cases = {
        "fixes": ["fixes", "--release", "0.5.22", "--timeout", "0"],
        "plan": ["plan", "--tp", "0"],
        "backport": ["backport", "--release", "v0.5.20", "--probe-timeout", "0"],
        "unknown": ["check", "--no-such-flag"],
        "value": ["fixes", "-f", "json", "-o", "{out}", "--release"],
    }
    for name, argv in cases.items():
        out = tmp_path / f"{name}.json"
        argv = [a.replace("{out}", str(out)) for a in argv]
        if "{out}" not in " ".join(cases[name]):
            argv += ["-f", "json", "-o", str(out)]
        res = runner.invoke(app, argv)
        assert res.exit_code == 2, (name, res.output)
        assert json.loads(out.read_text())["verdict"] == "usage_error", name
        assert res.stderr.count("kvgate: error: ") == 1, (name, res.stderr)


def test_a_profile_error_is_printed_once(tmp_path: Path) -> None:
    res = runner.invoke(app, ["check", "--prefill-url", "http://127.0.0.1:9", "--profile", str(tmp_path / "no.yaml")])
    assert res.exit_code == 2
    # the table may fold a long temp path across lines: count in the text with the folds taken out
    folded = re.sub(r"\s+", "", res.stdout)
    assert folded.count("no.yaml") == 1 and res.stderr.count("no.yaml") == 1, res.output


def test_on_a_terminal_a_usage_error_is_printed_once(tmp_path: Path) -> None:
    """stdout and stderr on one terminal: the report's headline says it, stderr does not repeat it."""
    import os
    import pty

    master, slave = pty.openpty()
    env = {**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": "200"}
    argv = [sys.executable, "-c", "from kvgate.cli import main; main()", "check", "--headroom", "-1"]
    proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=slave, stderr=slave, env=env, cwd=tmp_path)
    os.close(slave)
    chunks = []
    while True:
        try:
            data = os.read(master, 4096)
        except OSError:
            break
        if not data:
            break
        chunks.append(data)
    os.close(master)
    assert proc.wait(timeout=60) == 2
    screen = b"".join(chunks).decode()
    assert screen.count("Invalid value for '--headroom'") == 1, screen
    assert "USAGE ERROR" in screen and "check --help' for help." in screen


def test_top_level_help_shows_every_summary_whole() -> None:
    """click cuts a command's summary at the width with "..."; kvgate's group wraps it whole."""
    import typer.main

    from kvgate.commands._common import summary_of

    res = runner.invoke(app, ["--help"], terminal_width=80, env={"COLUMNS": "80"})
    listing = " ".join(res.output.split("Commands:")[1].split())
    assert res.exit_code == 0 and "..." not in listing, res.output
    for name, cmd in typer.main.get_command(app).commands.items():  # type: ignore[attr-defined]
        assert f"{name} {summary_of(cmd)}" in listing, name


def test_drill_and_sim_up_reproduce_the_same_release_by_default() -> None:
    from kvgate.defaults import INCIDENT_RELEASE

    for path in (["drill"], ["sim", "up"]):
        res = runner.invoke(app, [*path, "--help"], terminal_width=200, env={"COLUMNS": "200"})
        assert re.search(rf"\(default:? {re.escape(INCIDENT_RELEASE)}\b", " ".join(res.output.split())), path


def test_up_takes_plan_s_tp_spelling() -> None:
    res = runner.invoke(app, ["up", "--tp", "2", "--tp-size", "4", "--model-path", "m"])
    assert res.exit_code == 2 and "disagree" in res.output

"""One name for one idea: walk every command's options (what `--help` shows) and fail on two spellings
of one idea across commands, on a placeholder that is a Python type (`<list[str]>`) and on a second
style of defaults; kvgate answers an unknown command and a missing argument its own way."""

from __future__ import annotations

import re
from typing import Any

import pytest
import typer
from typer.testing import CliRunner

from kvgate.cli import app

runner = CliRunner()
# Spellings of one idea: a command may show at most the first of each group (others are hidden aliases).
SYNONYMS: tuple[tuple[str, ...], ...] = (
    ("--context-length", "--context-len", "--ctx-len", "--context"),
    ("--stop-after", "--intervals", "--max-intervals"),
    ("--format", "--fmt"),
    ("--output", "--out"),
    ("--token-env", "--token-var"),
    # A SGLang release: drill, up, sim up, plan, backport (`--to` was its spelling), fixes (`--version`).
    ("--release", "--emulate", "--to", "--version", "--sglang-version"),
    ("--deferred-release", "--deferred-release-env", "--deferred"),
)
# Not a spelling of an idea above: `kvgate --version` prints kvgate's own version.
NOT_SYNONYMS = {("kvgate", "--version")}


def _commands(cmd: Any = None, path: str = "kvgate") -> list[tuple[str, Any]]:
    cmd = cmd or typer.main.get_command(app)
    out = [(path, cmd)]
    for name, sub in (getattr(cmd, "commands", None) or {}).items():
        out += _commands(sub, f"{path} {name}")
    return out


def _shown(cmd: Any) -> set[str]:
    return {o for p in cmd.params if not getattr(p, "hidden", False) for o in [*p.opts, *p.secondary_opts]}


def test_one_spelling_per_idea_across_every_command() -> None:
    commands = _commands()
    assert len(commands) >= 10
    used: dict[str, set[str]] = {}
    for path, cmd in commands:
        for opt in _shown(cmd) - {o for p, o in NOT_SYNONYMS if p == path}:
            used.setdefault(opt, set()).add(path)
    for group in SYNONYMS:
        spelled = [o for o in group if o in used]
        assert len(spelled) <= 1, f"one idea, several names: {[(o, sorted(used[o])) for o in spelled]}"
        assert not spelled or spelled[0] == group[0], f"{spelled[0]} shown; the name is {group[0]}"


def test_every_help_walks() -> None:
    for path, _cmd in _commands():
        res = runner.invoke(app, [*path.split()[1:], "--help"])
        assert res.exit_code == 0, (path, res.output)


@pytest.mark.parametrize(
    ("argv", "said"),
    [
        (["chek"], "No such command 'chek'"),
        (["watch"], "Missing option '--router-url'"),
        (["sim", "bogus"], "No such command 'bogus'"),
    ],
)
def test_parser_errors_are_kvgate_errors(argv: list[str], said: str) -> None:
    res = runner.invoke(app, argv)
    assert res.exit_code == 2
    assert res.stderr.startswith(f"kvgate: error: {said}"), res.stderr
    assert "Usage:" not in res.stderr and "Error:" not in res.stderr


def test_old_spellings_still_work_and_say_so(tmp_path: Any) -> None:
    out = tmp_path / "r.json"
    res = runner.invoke(app, ["check", "--context-len", "8", "--context-length", "8", "-f", "json", "-o", str(out)])
    assert res.exit_code == 2 and "deprecated spelling of --context-length" in res.stderr
    res = runner.invoke(app, ["check", "--context-len", "8", "--headroom", "1.5", "-f", "json", "-o", str(out)])
    assert "--context-len is deprecated; use --context-length" in res.stderr


def _helps() -> list[tuple[str, str]]:
    out = []
    for path, _cmd in _commands():
        res = runner.invoke(app, [*path.split()[1:], "--help"], terminal_width=200, env={"COLUMNS": "200"})
        out.append((path, " ".join(res.output.split())))
    return out


def test_every_placeholder_says_what_goes_there() -> None:
    """URL, PATH, N, SECONDS, a choice list: never a Python type such as `<list[str]>` or `<float range>`."""
    for path, text in _helps():
        assert "<list[" not in text, (path, re.findall(r"<list\[[^>]*>", text))
        typed = re.findall(r"--[a-z-]+ <[^>]*>", text)
        assert not typed, (path, typed)


def test_one_style_of_defaults() -> None:
    """A default is said `(default: X)` in the option's help: never typer's `[default: X]`, never `(default X)`."""
    for path, text in _helps():
        assert "[default:" not in text, (path, re.findall(r"\[default:[^\]]*\]", text))
        assert not re.search(r"\(default [^)]", text), (path, re.findall(r"\(default [^)]*\)", text))


@pytest.mark.parametrize(
    ("argv", "old", "new", "then"),
    [
        (["drill", "--emulate", "0.4.0"], "--emulate", "--release", "'0.4.0': choose one of"),
        # the real server's release with no --device cpu: the value reached the plan, which refuses it
        (["up", "--emulate", "0.5.22"], "--emulate", "--release", "only with --device cpu"),
        (["backport", "--to", "v0.4.0"], "--to", "--release", "v0.4.0"),
        (["fixes", "--version", "0.5.20"], "--version", "--release", ""),
        (
            ["check", "--deferred-release-env", "--prefill-url", "ftp://x"],
            "--deferred-release-env",
            "--deferred-release",
            "ftp://x",
        ),
    ],
)
def test_old_release_spellings_still_work_and_say_so(
    argv: list[str], old: str, new: str, then: str, tmp_path: Any
) -> None:
    """The old spelling still means what it meant (the command reads its value), warned once on stderr."""
    out = tmp_path / "r.json"
    res = runner.invoke(app, [*argv, "-f", "json", "-o", str(out)])
    assert f"kvgate: warning: {old} is deprecated; use {new}" in res.stderr, res.stderr
    assert res.stderr.count("warning") == 1
    assert then in res.stderr, res.stderr
    if argv[0] == "fixes":  # 0.5.20 judged: a correctness fix is missing
        assert res.exit_code == 1 and "0.5.20" in out.read_text(), res.output
    both = runner.invoke(app, [*argv[:1], old, *argv[argv.index(old) + 1 :][:1], new, "x", "-f", "json"])
    if old != "--deferred-release-env":
        assert both.exit_code == 2 and f"{old} is the deprecated spelling of {new}" in both.stderr, both.stderr


def test_sim_up_old_deferred_form_is_the_one_flag_pair() -> None:
    """`sim up --deferred-release on|off|default` (its old form) reads as --deferred-release / --no-... / neither."""
    from kvgate.sim.cli import _SimUpCommand

    cmd = typer.main.get_command(app).commands["sim"].commands["up"]  # type: ignore[attr-defined]
    assert isinstance(cmd, _SimUpCommand)
    for old, want in (("on", True), ("off", False), ("default", None)):
        ctx = cmd.make_context("up", ["--deferred-release", old, "--prefill", "2"], resilient_parsing=True)
        assert ctx.params["deferred_release"] is want and ctx.params["prefill"] == 2, (old, ctx.params)
    ctx = cmd.make_context("up", ["--no-deferred-release"], resilient_parsing=True)
    assert ctx.params["deferred_release"] is False

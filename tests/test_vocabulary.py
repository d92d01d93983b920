"""One name for one idea: walk every command's options (what `--help` shows) and fail on two spellings
of one idea across commands; kvgate answers an unknown command and a missing argument its own way."""

from __future__ import annotations

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
)


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
        for opt in _shown(cmd):
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

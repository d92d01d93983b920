"""The YAML the repository ships (action.yml, examples/, gate_profiles/) is clean under the yamllint
configuration it carries (.yamllint): an operator's linter finds nothing in what they copy."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SHIPPED = [
    ROOT / "action.yml",
    *sorted((ROOT / "examples").rglob("*.y*ml")),
    *sorted((ROOT / "gate_profiles").glob("*.yaml")),
]


def test_shipped_yaml_is_yamllint_clean() -> None:
    from yamllint import config, linter  # the test extra pins it

    conf = config.YamlLintConfig(file=str(ROOT / ".yamllint"))
    assert len(SHIPPED) >= 15, SHIPPED
    problems = [
        f"{path.relative_to(ROOT)}:{p.line}:{p.column}: {p.desc} ({p.rule})"
        for path in SHIPPED
        for p in linter.run(path.read_text(), conf, str(path))
    ]
    assert not problems, "\n".join(problems)


def test_the_config_is_strict_where_it_matters() -> None:
    """The config relaxes only what it says (width 120, no `---`, GitHub's `on:` key), and still catches."""
    from yamllint import config, linter  # the test extra pins it

    conf = config.YamlLintConfig(file=str(ROOT / ".yamllint"))
    bad = "a: 1\na: 2\nb:   [1,2]\nlong: " + "x" * 130 + "\n"
    rules = {p.rule for p in linter.run(bad, conf)}
    assert {"key-duplicates", "line-length"} <= rules, rules

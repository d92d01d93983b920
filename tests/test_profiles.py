"""The bundled profiles (gate_profiles/) load, and cpu-tiny sets nothing the probes size themselves."""

from __future__ import annotations

import pytest

from kvgate.gates.probes.settings import ProbeSettings
from kvgate.paths import profiles_dir
from kvgate.profiles import load

BUNDLED = sorted(p.stem for p in profiles_dir().glob("*.yaml"))


@pytest.mark.parametrize("name", BUNDLED)
def test_every_bundled_profile_loads(name: str) -> None:
    profile = load(name)
    ProbeSettings.from_mapping(profile.probes, name)


def test_cpu_tiny_leaves_the_sizes_to_the_calibration() -> None:
    """The real tier passes with no profile; cpu-tiny only makes the drill cheaper (issue 19)."""
    sized_by_calibration = {"latency_samples", "latency_long_tokens", "abort_tokens", "abort_budget", "budget_floor_s"}
    assert "cpu-tiny" in BUNDLED
    assert not sized_by_calibration & set(load("cpu-tiny").probes)


@pytest.mark.parametrize(
    ("text", "where"),
    [("schema: 1\nname: x\n  bad: [\n", "line 3, column 6: mapping values"), ('a: "x\n', "line 2, column 1:")],
)
def test_malformed_profile_names_the_file_line_and_column(tmp_path, text: str, where: str) -> None:  # type: ignore[no-untyped-def]
    """One line naming the file and the place: never PyYAML's "<unicode string>" stream name, nor a
    line break that a sink shows as a literal \\x0a."""
    from typer.testing import CliRunner

    from kvgate.cli import app

    bad = tmp_path / "bad.yaml"
    bad.write_text(text)
    res = CliRunner().invoke(app, ["check", "--profile", str(bad), "--prefill-url", "http://127.0.0.1:9"])
    out = res.stdout + (res.stderr or "")
    assert res.exit_code == 2 and f"profile {bad}: not valid YAML: {where}" in " ".join(out.split())
    assert "<unicode string>" not in out and "\\x0a" not in out

"""The bundled profiles (gate_profiles/) load, and cpu-tiny sets nothing the probes size themselves."""

from __future__ import annotations

import pytest

from kvgate.gates.probes.settings import ProbeSettings
from kvgate.gates.profiles import load
from kvgate.paths import profiles_dir

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


#: the longest accepted prompt's prefill alone on a healthy deployment: about a minute at a 1M context
#: (GLM-5.3's ~17k tokens/s), at most 25 s for any context a profile without one is used at
ALONE_S = {1 << 20: 60.0}


@pytest.mark.parametrize("name", BUNDLED)
def test_every_bundled_profile_states_a_soak_section_sane_for_its_context(name: str) -> None:
    """A healthy deployment's near-limit prompt under the profile's soak load is answered within its own
    deadline (probes.deadline_s + its prefill allowance) and under SGLang's waiting timeout: at 8 in
    flight a 1M prefill's allowance (9 x 60 s) would not be."""
    from kvgate.gates.probes.settings import SGLANG_WAITING_TIMEOUT_S
    from kvgate.soak.settings import SoakSettings
    from kvgate.soak.slo import Allowance, prefill_share

    profile = load(name)
    assert profile.soak, f"{name} states no soak: section"
    settings = SoakSettings.from_mapping(profile.soak, name)
    probes = ProbeSettings.from_mapping(profile.probes, name)
    context = profile.context_length or 0
    alone = ALONE_S.get(context, 25.0)
    allowance = Allowance(max(context, 1) / alone, prefill_share(settings.concurrency), "test")
    longest = allowance.extra_s(max(context, 1)) or 0.0
    assert probes.deadline_s + longest < SGLANG_WAITING_TIMEOUT_S, (name, longest)
    assert settings.slice_s >= alone  # a slice holds at least one whole prefill of the longest prompt
    if context >= 1 << 20:
        assert settings.concurrency < SoakSettings().concurrency

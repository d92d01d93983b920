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

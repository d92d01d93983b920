"""ProbeSettings: defaults, validation and the ProfileError it raises."""

from __future__ import annotations

import pytest

from kvgate.errors import ProfileError
from kvgate.gates.probes import ProbeSettings


def test_defaults_are_safe() -> None:
    s = ProbeSettings.from_mapping(None, "p.yaml")
    assert s.deadline_s < 300 and s.tenants == 32 and s.early_stop and s.abort_probe
    assert s.reject_limit_s == min(s.reject_within_s, s.deadline_s)


def test_values_are_taken() -> None:
    s = ProbeSettings.from_mapping(
        {"deadline_s": 5, "tenants": 4, "early_stop": False, "tokenizer": "bytes", "latency_long_tokens": None},
        "p.yaml",
    )
    assert (s.deadline_s, s.tenants, s.early_stop, s.tokenizer) == (5.0, 4, False, "bytes")


@pytest.mark.parametrize(
    "mapping, key",
    [
        ({"nope": 1}, "probes.nope"),
        ({"deadline_s": 300}, "probes.deadline_s"),
        ({"deadline_s": "10"}, "probes.deadline_s"),
        ({"tenants": True}, "probes.tenants"),
        ({"tenants": 0}, "probes.tenants"),
        ({"early_stop": 1}, "probes.early_stop"),
        ({"tokenizer": "sentencepiece"}, "probes.tokenizer"),
        ({"latency_alpha": 0.7}, "probes.latency_alpha"),
        ({"abort_tokens": 0}, "probes.abort_tokens"),
    ],
)
def test_bad_values_name_file_and_key(mapping: dict, key: str) -> None:
    with pytest.raises(ProfileError) as exc:
        ProbeSettings.from_mapping(mapping, "gate.yaml")
    assert exc.value.path == "gate.yaml" and exc.value.key == key

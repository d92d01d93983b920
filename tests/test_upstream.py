"""The release facts kvgate.upstream keeps, against the real wheels they come from."""

from __future__ import annotations

import re

import pytest

from kvgate.upstream import DEFERRED_ENV, DEFERRED_RELEASE_DEFAULT, RELEASES
from tests.assets.real_sglang import wheel_or_skip


def test_every_release_has_a_deferred_release_default() -> None:
    assert tuple(DEFERRED_RELEASE_DEFAULT) == RELEASES


@pytest.mark.wheels
@pytest.mark.parametrize("release", RELEASES)
def test_deferred_release_default_is_what_the_wheel_sets(release: str) -> None:
    environ = (wheel_or_skip(release) / "sglang" / "srt" / "environ.py").read_text(encoding="utf-8")
    found = re.findall(rf"^\s*{DEFERRED_ENV} = EnvBool\((True|False)\)", environ, flags=re.M)
    assert found == [str(DEFERRED_RELEASE_DEFAULT[release])], found

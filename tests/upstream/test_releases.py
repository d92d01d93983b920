"""The release facts kvgate.upstream.releases keeps, against the real wheels they come from."""

from __future__ import annotations

import re

import pytest

from kvgate.upstream.releases import DEFERRED_ENV, DEFERRED_RELEASE_DEFAULT, HEALTH_CHECK_TIMEOUT_S, RELEASES
from tests.assets.real_sglang import wheel_or_skip


def test_every_release_has_a_deferred_release_default() -> None:
    assert tuple(DEFERRED_RELEASE_DEFAULT) == RELEASES


@pytest.mark.wheels
@pytest.mark.parametrize("release", RELEASES)
def test_deferred_release_default_is_what_the_wheel_sets(release: str) -> None:
    environ = (wheel_or_skip(release) / "sglang" / "srt" / "environ.py").read_text(encoding="utf-8")
    found = re.findall(rf"^\s*{DEFERRED_ENV} = EnvBool\((True|False)\)", environ, flags=re.M)
    assert found == [str(DEFERRED_RELEASE_DEFAULT[release])], found


@pytest.mark.wheels
@pytest.mark.parametrize("release", RELEASES)
def test_health_check_timeout_is_what_the_wheel_sets(release: str) -> None:
    server = (wheel_or_skip(release) / "sglang" / "srt" / "entrypoints" / "http_server.py").read_text(encoding="utf-8")
    found = re.findall(
        r'^HEALTH_CHECK_TIMEOUT = int\(os.getenv\("SGLANG_HEALTH_CHECK_TIMEOUT", (\d+)\)\)', server, flags=re.M
    )
    assert found == [str(HEALTH_CHECK_TIMEOUT_S)], found
    # It answers only after its first 1 s poll, so a 1 s readiness read never sees it healthy.
    health = server[server.index("async def health_generate") :]
    assert health.index("await asyncio.sleep(1)") < health.index("last_receive_tstamp > tic")

"""The manifests' hashes are those of the real release wheels, patch by patch."""

from __future__ import annotations

import pytest

from kvgate.backport.regen import recompute
from kvgate.catalogue.series import load_series
from kvgate.upstream.releases import DownloadError
from tests.assets.real_sglang import skip_only_if_unreachable

pytestmark = pytest.mark.wheels


@pytest.mark.parametrize("release", ["0.5.19", "0.5.20"])
def test_manifest_hashes_match_the_real_wheel(release: str) -> None:
    try:
        fresh = recompute(release)
    except DownloadError as exc:
        skip_only_if_unreachable(exc, f"sglang {release} wheel")
    recorded = [
        {
            "id": p.id,
            "files": [
                {"path": f.path, "sha256_before": f.sha256_before, "sha256_after": f.sha256_after} for f in p.files
            ],
        }
        for p in load_series(release).patches
    ]
    assert sorted(fresh, key=str) == sorted(recorded, key=str)

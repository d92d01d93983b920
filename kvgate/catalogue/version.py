"""Detection by release string (method 1): PEP 440 aware, via `packaging`.

Only the five wheels 0.5.19-0.5.23 were verified. What a version string can tell:
- a final release that was verified: exactly what its wheel carries;
- a dev/pre build of release B: what the verified release before B carried (inferred: a development
  build follows the previous release); fixes that first shipped in B are unknown (the build may predate
  their merge); later ones are absent;
- a post or local build of a verified B (and B.N): what B carried; anything later is unknown, because such
  builds may carry backports (ours included);
- older than the oldest verified release: fixes first seen after it are absent (inferred), the rest unknown;
- newer than the newest verified release (0.5.24, 0.6.0, their dev/post/local builds, all compared by
  PEP 440): what the newest verified release carries is assumed present by release order, as WEAK
  evidence (never enough to pass a correctness fix); fixes in no verified release are unknown.
A local part `+g<sha>` names the commit the build came from; `--repo` can then check ancestry.
kvgate backports are never visible in a version string: they read as unknown here.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass

from packaging.version import InvalidVersion, Version

from kvgate.catalogue.model import Catalogue, Detection, Fix, Presence
from kvgate.errors import UsageError

_COMMIT = re.compile(r"^g([0-9a-f]{7,40})$")


@dataclass(frozen=True)
class ReleaseString:
    """A parsed sglang version string."""

    raw: str
    version: Version
    base: Version
    commit: str | None

    @property
    def is_final(self) -> bool:
        v = self.version
        return not (v.is_prerelease or v.is_devrelease or v.is_postrelease or v.local) and v == self.base

    @property
    def kind(self) -> str:
        v = self.version
        if v.is_devrelease or v.is_prerelease:
            return "dev/pre-release"
        if v.is_postrelease or v.local or v != self.base:
            return "post/local build"
        return "final release"


@functools.lru_cache(maxsize=1024)  # a fleet reports one or two strings, once per node and gate
def parse_release(raw: str) -> ReleaseString:
    """Parse an sglang version; a string that is not PEP 440 is a usage error (exit 2)."""
    text = (raw or "").strip()
    if text.startswith(("v", "V")):
        text = text[1:]
    try:
        v = Version(text)
    except InvalidVersion:
        raise UsageError(
            f"version {raw!r} is not a PEP 440 version (expected e.g. 0.5.20, 0.5.21.dev12+g8f3d694, 0.5.20.post1)"
        ) from None
    rel = (tuple(v.release) + (0, 0, 0))[:3]
    base = Version(".".join(str(x) for x in rel))
    commit = None
    if v.local:
        for part in v.local.split("."):
            m = _COMMIT.match(part)
            if m:
                commit = m.group(1)
                break
    return ReleaseString(raw=raw, version=v, base=base, commit=commit)


def _in_verified(fix: Fix, release: Version) -> bool:
    return fix.first_release is not None and release >= fix.first_release


def detect_fix(cat: Catalogue, rel: ReleaseString, fix: Fix) -> Detection:
    """What the release string alone says about one fix."""
    verified = cat.verified_releases
    oldest, newest = verified[0], verified[-1]
    tag = f"sglang {rel.raw} ({rel.kind})"

    def d(p: Presence, why: str, weak: bool = False) -> Detection:
        ev = [f"{tag}: {why}"]
        if rel.commit:
            ev.append(f"build commit {rel.commit} (from the local version part); --repo can check its ancestry")
        return Detection(fix.id, "version", p, tuple(ev), weak)

    if fix.is_backport:
        return d(Presence.UNKNOWN, "a version string cannot show kvgate backports; read the source")
    first = (
        "in no verified release"
        if fix.first_release is None
        else (f"first in {fix.first_release}" + (" or earlier" if fix.first_release_bound == "at-or-before" else ""))
    )
    if rel.version > newest and rel.base > newest:
        if _in_verified(fix, newest):
            return d(
                Presence.PRESENT,
                f"assumed present by release order: newer than the newest verified release "
                f"{newest}, which carries it ({first}); weak evidence, read the code",
                weak=True,
            )
        return d(Presence.UNKNOWN, f"newer than the newest verified release {newest} ({first}); read the code")
    if rel.base < oldest:
        if (
            fix.first_release is None
            or fix.first_release > oldest
            or (fix.first_release == oldest and fix.first_release_bound == "exact")
        ):
            return d(Presence.ABSENT, f"older than {oldest}, which lacks it ({first}); inferred")
        return d(Presence.UNKNOWN, f"older than the oldest verified release {oldest} ({first})")
    if rel.base not in verified:
        return d(Presence.UNKNOWN, f"release {rel.base} was not verified ({first})")
    if rel.is_final:
        p = Presence.PRESENT if _in_verified(fix, rel.base) else Presence.ABSENT
        return d(p, f"verified against the {rel.base} wheel ({first})")
    if rel.version.is_devrelease or rel.version.is_prerelease:
        earlier = [r for r in verified if r < rel.base]
        if earlier and _in_verified(fix, earlier[-1]):
            return d(Presence.PRESENT, f"in {earlier[-1]}, which a development build of {rel.base} follows; inferred")
        if fix.first_release is not None and fix.first_release == rel.base:
            return d(Presence.UNKNOWN, f"{first}: a development build of {rel.base} may predate its merge")
        if not earlier and fix.first_release_bound == "at-or-before":
            return d(Presence.UNKNOWN, f"{first}: no verified release before {rel.base}")
        return d(Presence.ABSENT, f"not in {rel.base} itself ({first}); inferred")
    # post-release, local build, or B.N: starts from B and may carry backports
    if _in_verified(fix, rel.base):
        return d(Presence.PRESENT, f"in {rel.base}, which this build starts from ({first}); inferred")
    return d(Presence.UNKNOWN, f"not in {rel.base} ({first}), but a post/local build may carry a backport")


def detect_by_version(cat: Catalogue, rel: ReleaseString) -> dict[str, Detection]:
    """Method 1 for every catalogue entry."""
    return {f.id: detect_fix(cat, rel, f) for f in cat.fixes}

"""Shared test helpers: the real wheels, the section-3 presence matrix, a small sglang git repo."""

from __future__ import annotations

import shutil
from pathlib import Path

import git

from kvgate.upstream.releases import RELEASES
from tests.assets.real_sglang import wheel_or_skip

# upstream-fixes.md section 3 (grep of the published wheels), one row per catalogue entry:
# the releases (of 0.5.19..0.5.23) whose wheel carries the entry's signatures.
ALL = set(RELEASES)
EXPECTED: dict[str, set[str]] = {
    "issue-30233": set(),  # its proposed notify_decode_abort patch: count 0 in all five
    "pr-30325": set(),
    "pr-35049": ALL,
    "pr-35360": ALL,
    "pr-37454": ALL - {"0.5.19"},
    "pr-36612": ALL - {"0.5.19"},
    "pr-36988": ALL - {"0.5.19"},
    "pr-38935": {"0.5.21", "0.5.22", "0.5.23"},
    "pr-38704": set(),
    "pr-39500": {"0.5.21", "0.5.22", "0.5.23"},
    "checksum-safety": {"0.5.23"},
    "pr-40645": {"0.5.21", "0.5.22", "0.5.23"},
    "pr-41402": {"0.5.21", "0.5.22", "0.5.23"},
    "pr-41404": {"0.5.21", "0.5.22", "0.5.23"},
    "pr-41023": {"0.5.21", "0.5.22", "0.5.23"},  # EnvBool(True) + capability attr rows
    "ack-generations": {"0.5.22", "0.5.23"},  # section 1/9: AckTarget refactor from 0.5.22
    "mori-deferred-release": {"0.5.22", "0.5.23"},
    "kv-canary": ALL,
    # upstream-2026-12.md: merged fixes already in the oldest verified wheel (a fork may lack them)
    "pr-17430": ALL,
    "pr-27374": ALL,  # inline in decode.py to 0.5.22, MetadataBuffers.clear_slot (utils.py) in 0.5.23
    "pr-27372": ALL,
    "pr-30352": ALL,  # sticky Failed in nixl/conn.py (0.5.19), in common/conn.py from 0.5.20
    "pr-39357": ALL - {"0.5.19"},
    "unified-pool-transfer": ALL,
    "zmq-send-lock": ALL,
    # open problems: the affected code, in every verified release (no release fixes them)
    "open-36707": ALL,
    "open-40731": ALL,
    "open-40125": ALL,
    "open-29978": ALL,
    "kvgate-admission-door": set(),
    "kvgate-deferred-release-default": set(),
    "kvgate-retire-aborted-results": set(),
    "kvgate-verify-handoff-coverage": set(),
    "kvgate-preserve-abort-ack": set(),
    "kvgate-ack-fanout": set(),
    "kvgate-force-arm-on-failure": set(),
    "kvgate-ack-generations": set(),
}

# The files the catalogue's signatures read, so small trees and repos can be built from real sources.
SIGNATURE_FILES = (
    "__init__.py",
    "version.py",
    "_version.py",
    "srt/environ.py",
    "srt/managers/scheduler.py",
    "srt/managers/schedule_batch.py",
    "srt/managers/io_struct.py",
    "srt/mem_cache/allocator/base.py",
    "srt/arg_groups/fields/disagg.py",
    "srt/kv_canary/api.py",
    "kernels/ops/memory/adler32.py",
)
SIGNATURE_DIRS = ("srt/disaggregation",)


def wheel(version: str) -> Path:
    """The unpacked real wheel (site-packages layout); skip only when the package index is unreachable."""
    return wheel_or_skip(version)


def copy_signature_tree(version: str, dest: Path) -> Path:
    """Copy the real files the signatures read from the sglang `version` wheel into dest (a package dir)."""
    src = wheel(version) / "sglang"
    if dest.exists():
        shutil.rmtree(dest)
    dest.mkdir(parents=True)
    for rel in SIGNATURE_FILES:
        if (src / rel).is_file():
            (dest / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src / rel, dest / rel)
    for rel in SIGNATURE_DIRS:
        shutil.copytree(src / rel, dest / rel, ignore=shutil.ignore_patterns("__pycache__"))
    return dest


def add_marker(package_dir: Path, rel: str, patch_id: str) -> None:
    """What a kvgate backport does to each file it changes: add the marker comment line."""
    p = package_dir / rel
    p.write_text(p.read_text(encoding="utf-8") + f"\n# kvgate-backport: {patch_id}\n", encoding="utf-8")


def commit_release(repo: git.Repo, version: str, subject: str) -> git.Commit:
    """Replace python/sglang with the real `version` sources and commit with a squash-style subject."""
    root = Path(repo.working_tree_dir)
    copy_signature_tree(version, root / "python" / "sglang")
    repo.git.add("-A", "python")
    repo.git.commit("-q", "-m", subject, "--allow-empty")
    return repo.head.commit


def init_repo(path: Path) -> git.Repo:
    repo = git.Repo.init(path)
    with repo.config_writer() as cw:
        cw.set_value("user", "name", "kvgate tests")
        cw.set_value("user", "email", "tests@kvgate.invalid")
        cw.set_value("commit", "gpgsign", "false")
    return repo

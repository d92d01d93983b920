"""Fixtures for the backport tests: real sglang wheels, CPU environments, checkouts and installs made from them.

Everything heavy is built once into the git-ignored cache (kvgate.paths.cache_dir()) and reused; tests
only get private copies. Tests skip, with the reason, only when the package index cannot be reached.
"""

from __future__ import annotations

import hashlib
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest

from kvgate.backport.cpuenv import CpuEnv, copy_site_packages
from tests.assets.real_sglang import cpu_env_or_skip, wheel_or_skip


@pytest.fixture(scope="session")
def cpu_envs() -> Callable[[str], CpuEnv]:
    """cpu_envs("0.5.20") -> the cached CPU environment of that release (built on first use)."""
    return cpu_env_or_skip


def tree_digest(root: Path) -> dict[str, str]:
    """sha256 of every file under root (relative paths), to prove byte-for-byte identity."""
    out = {}
    for p in sorted(root.rglob("*")):
        if p.is_file() and "__pycache__" not in p.parts:
            out[str(p.relative_to(root))] = hashlib.sha256(p.read_bytes()).hexdigest()
    return out


def _git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True, text=True).stdout


@pytest.fixture(scope="session")
def _base_checkouts(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], Path]:
    made: dict[str, Path] = {}

    def get(version: str) -> Path:
        if version not in made:
            src = wheel_or_skip(version) / "sglang"
            repo = tmp_path_factory.mktemp(f"sglang-{version}-base")
            shutil.copytree(src, repo / "python" / "sglang")
            _git(repo, "init", "-q", "-b", "main")
            _git(repo, "add", "-A")
            _git(
                repo,
                "-c",
                "user.name=wheel",
                "-c",
                "user.email=wheel@example.invalid",
                "commit",
                "-qm",
                f"sglang {version} (wheel source in python/sglang layout)",
            )
            made[version] = repo
        return made[version]

    return get


@pytest.fixture()
def checkout(_base_checkouts: Callable[[str], Path], tmp_path: Path) -> Callable[[str], Path]:
    """checkout("0.5.20") -> a private git clone of a repo built from the real wheel's source."""

    def make(version: str) -> Path:
        dest = tmp_path / f"repo-{version}"
        subprocess.run(["git", "clone", "-q", str(_base_checkouts(version)), str(dest)], check=True)
        _git(dest, "config", "user.name", "tester")
        _git(dest, "config", "user.email", "tester@example.invalid")
        return dest

    return make


@pytest.fixture()
def site(cpu_envs: Callable[[str], CpuEnv], tmp_path: Path) -> Callable[[str], CpuEnv]:
    """site("0.5.20") -> a private, writable copy of the installed release (site-packages layout)."""

    def make(version: str) -> CpuEnv:
        return copy_site_packages(cpu_envs(version), tmp_path / f"site-{version}")

    return make

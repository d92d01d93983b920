"""CPU environments that run the real sglang PD admission code (recipe: shared/reference/cpu-sglang.md).

One base venv per pin set (torch 2.13.0 CPU and sglang's import-time dependencies) and, per release, an
overlay directory made with `pip install --no-deps --target` that holds that release's sglang wheel plus
the few dependency versions the release needs over the base. A release runs as
`PYTHONPATH=<overlay>:<stub dir> <base>/bin/python`. Everything lives under `cache_dir()/cpuenv`
(git-ignored), is built once, file-locked, and marked complete only after it imported.

Nothing here imports sglang into the calling process.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from kvgate.errors import KvgateError
from kvgate.output.safeio import write_atomic
from kvgate.paths import cache_dir
from kvgate.upstream.releases import DownloadError, index_unreachable, locked, wheel_path

STUB_DIR = Path(__file__).resolve().parent / "_stub"
"""Holds `sitecustomize.py`: the torchvision STUB (not torchvision) every CPU environment needs."""

# Pins of cpu-sglang.md. An unpinned torchvision or xgrammar pulls a CUDA torch and GBs of nvidia wheels.
BASE_PINS: tuple[str, ...] = (
    "torch==2.13.0",
    "torchvision==0.28.0",
    "transformers==5.12.1",
    "tokenizers==0.22.2",
    "xgrammar==0.2.1",
    "compressed-tensors==0.18.0",
    "openai==2.6.1",
    "triton==3.7.0",
)
BASE_PACKAGES: tuple[str, ...] = (
    "orjson",
    "psutil",
    "pybase64",
    "requests",
    "packaging",
    "pillow",
    "starlette",
    "msgspec",
    "pyzmq",
    "tqdm",
    "IPython",
    "pydantic",
    "aiohttp",
    "transformers",
    "dill",
    "compressed-tensors",
    "gguf",
    "openai",
    "partial-json-parser",
    "xgrammar",
    "sentencepiece",
    "einops",
    "triton",
    "setproctitle",
    "uvicorn",
    "fastapi",
    "regex",
)
# What a release needs over the base (installed --no-deps into its overlay so it shadows the base).
OVERLAY_EXTRAS: dict[str, tuple[str, ...]] = {
    "0.5.19": (),
    "0.5.20": (),
    "0.5.21": ("xgrammar==0.2.7", "sentencepiece==0.2.1"),
    "0.5.22": ("xgrammar==0.2.7", "sentencepiece==0.2.1", "transformers==5.19.0", "tokenizers==0.23.2"),
    "0.5.23": ("xgrammar==0.2.7", "sentencepiece==0.2.1", "transformers==5.19.0", "tokenizers==0.23.2"),
}
# What the page-lifetime probes import over the admission code (sglang's Mooncake connection module reaches
# prometheus_client through its metrics; msgpack through its wire format). Installed into the base under
# the same pins with a marker of its own: kept out of _RECIPE_ID, so adding to it completes an existing
# base instead of rebuilding every CPU environment.
PROBE_PACKAGES: tuple[str, ...] = ("prometheus_client", "msgpack")
_RECIPE_ID = hashlib.sha256(repr((BASE_PINS, BASE_PACKAGES, OVERLAY_EXTRAS)).encode()).hexdigest()[:12]


class CpuEnvError(KvgateError):
    """A CPU sglang environment could not be built (exit 2: a setup problem, not a verdict)."""


@dataclass(frozen=True)
class CpuEnv:
    """How to run one sglang release on CPU: the interpreter and the PYTHONPATH entries it needs."""

    version: str
    python: str
    pythonpath: tuple[str, ...]

    def env(self, base: dict[str, str] | None = None) -> dict[str, str]:
        """A process environment that imports this release (never SGLANG_USE_CPU_ENGINE: see cpu-sglang.md)."""
        out = dict(os.environ if base is None else base)
        out["PYTHONPATH"] = os.pathsep.join(self.pythonpath)
        out.pop("SGLANG_USE_CPU_ENGINE", None)
        out.pop("PYTHONHOME", None)
        return out

    @property
    def site_packages(self) -> Path:
        """The overlay: a site-packages layout that holds this release's `sglang/`."""
        return Path(self.pythonpath[0])


def root() -> Path:
    """Where the CPU environments live."""
    path = cache_dir() / "cpuenv"
    path.mkdir(parents=True, exist_ok=True)
    return path


def pins_file() -> Path:
    """The constraint file every pip step of the base venv runs under."""
    return root() / f"pins-{_RECIPE_ID}.txt"


def run_step(cmd: list[str], env: dict[str, str] | None = None, what: str = "") -> None:
    """Run one build step; a failure names the step (DownloadError when the index did not serve it)."""
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if proc.returncode != 0:
        tail = "\n".join((proc.stderr or proc.stdout).strip().splitlines()[-8:])
        if "No matching distribution" in tail or "Could not find a version" in tail or "ConnectionError" in tail:
            raise DownloadError(what or cmd[0], tail, unreachable=index_unreachable(proc.stderr + proc.stdout))
        raise CpuEnvError(f"{what or ' '.join(cmd)} failed:\n{tail}")


def pip_env(pin_file: Path) -> dict[str, str]:
    """A pip environment constrained by `pin_file`, blind to any PYTHONPATH."""
    env = dict(os.environ)
    env["PIP_CONSTRAINT"] = str(pin_file)
    env.pop("PYTHONPATH", None)
    return env


def base_python() -> Path:
    """Build (once) the shared base venv and return its interpreter."""
    base = root() / f"base-{_RECIPE_ID}"
    marker = base / ".kvgate-complete"
    with locked(root() / "base.lock"):
        if marker.is_file():
            _probe_packages(base)
            return base / "bin" / "python"
        if base.exists():
            shutil.rmtree(base)
        pins = pins_file()
        write_atomic(pins, "\n".join(BASE_PINS) + "\n")
        run_step([sys.executable, "-m", "venv", str(base)], what="python -m venv")
        py = str(base / "bin" / "python")
        env = pip_env(pins)
        run_step([py, "-m", "pip", "install", "-q", "torch==2.13.0", "numpy"], env, "pip install torch (CPU)")
        run_step([py, "-m", "pip", "install", "-q", *BASE_PACKAGES], env, "pip install sglang's import-time deps")
        write_atomic(marker, _RECIPE_ID)
        _probe_packages(base)
        return Path(py)


def _probe_packages(base: Path) -> None:
    """Install PROBE_PACKAGES into the base once per list (the caller holds base.lock)."""
    marker = base / ".kvgate-probe-packages"
    if marker.is_file() and marker.read_text() == repr(PROBE_PACKAGES):
        return
    py = str(base / "bin" / "python")
    run_step([py, "-m", "pip", "install", "-q", *PROBE_PACKAGES], pip_env(pins_file()), "pip install the probes' deps")
    write_atomic(marker, repr(PROBE_PACKAGES))


def overlay_dir(version: str) -> Path:
    """Where release `version`'s sglang (site-packages layout) is installed for the CPU environment."""
    return root() / f"sglang-{version}-{_RECIPE_ID}"


def cpu_env(version: str) -> CpuEnv:
    """The CPU environment for sglang `version`, built on first use (minutes cold, instant warm)."""
    if version not in OVERLAY_EXTRAS:
        raise CpuEnvError(f"no CPU recipe for sglang {version}; known: {', '.join(OVERLAY_EXTRAS)}")
    py = base_python()
    target = overlay_dir(version)
    marker = target / ".kvgate-complete"
    with locked(root() / f"sglang-{version}.lock"):
        if not marker.is_file():
            if target.exists():
                shutil.rmtree(target)
            whl = wheel_path(version)
            pins = pins_file()
            env = pip_env(pins)
            env.pop("PIP_CONSTRAINT")  # the overlay's extras deliberately differ from the base pins
            run_step(
                [
                    str(py),
                    "-m",
                    "pip",
                    "install",
                    "-q",
                    "--no-deps",
                    "--target",
                    str(target),
                    str(whl),
                    *OVERLAY_EXTRAS[version],
                ],
                env,
                f"pip install --target sglang {version}",
            )
            write_atomic(marker, version)
    return CpuEnv(version=version, python=str(py), pythonpath=(str(target), str(STUB_DIR)))


def copy_site_packages(env: CpuEnv, dest: Path) -> CpuEnv:
    """A private, writable copy of a release's overlay (for tests that patch an installed sglang)."""
    if dest.exists():
        shutil.rmtree(dest)
    shutil.copytree(env.site_packages, dest, symlinks=True, ignore=shutil.ignore_patterns(".kvgate-complete"))
    return CpuEnv(version=env.version, python=env.python, pythonpath=(str(dest), *env.pythonpath[1:]))


def main(argv: list[str] | None = None) -> int:
    """`python -m kvgate.backport.cpuenv 0.5.20 ...`: build environments ahead of the tests (CI)."""
    versions = (argv if argv is not None else sys.argv[1:]) or ["0.5.19", "0.5.20", "0.5.21"]
    for v in versions:
        env = cpu_env(v)
        print(f"{v}: PYTHONPATH={os.pathsep.join(env.pythonpath)} {env.python}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

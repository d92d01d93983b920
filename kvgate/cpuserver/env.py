"""What the real SGLang server of one release needs to run on CPU (shared/reference/cpu-sglang.md).

On top of the CPU environment that runs sglang's admission code (`kvgate.backport.cpuenv`): the server's
own runtime packages and Mooncake's TCP transfer engine, installed once into the base venv under the
same pins; the system libraries Mooncake's engine links even for TCP (`libibverbs.so.1`,
`librdmacm.so.1`); and the process environment (the sgl_kernel and torchvision STUBS first on
PYTHONPATH, SGLANG_USE_CPU_ENGINE, Mooncake over TCP, one OpenMP thread, no hub access).
"""

from __future__ import annotations

import ctypes.util
import json
import os
import re
import shutil
import subprocess
from dataclasses import dataclass, replace
from pathlib import Path

from kvgate.backport.cpuenv import CpuEnvError, base_python, cpu_env, pins_file, pip_env, root, run_step
from kvgate.output.safeio import write_atomic
from kvgate.upstream.releases import locked

STUB_DIR = Path(__file__).resolve().parent / "_stub"
"""`sitecustomize.py` (torchvision STUB + the 0.5.23 Mooncake host-pinning workaround) and the sgl_kernel STUB."""

SERVER_PACKAGES: tuple[str, ...] = (
    "uvloop",
    "jsonschema",
    "soundfile",
    "python-multipart",
    "prometheus_client",
    "msgpack",
    "mooncake-transfer-engine-non-cuda==0.3.13.post1",
)
SYSTEM_LIBS = ("ibverbs", "rdmacm")
SYSTEM_DEBS = ("libibverbs1", "librdmacm1", "libnl-3-200", "libnl-route-3-200")

# Environment of every server process (cpu-sglang.md: each one was needed).
SERVER_ENV: dict[str, str] = {
    "SGLANG_USE_CPU_ENGINE": "1",
    "MC_FORCE_TCP": "1",
    "MOONCAKE_PROTOCOL": "tcp",
    "OMP_NUM_THREADS": "1",
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "KVGATE_CPU_SERVER": "1",
}


CPU_MEM_FRACTION_STATIC = 0.05
_CPU_FLAGS = (
    "--device",
    "cpu",
    "--attention-backend",
    "torch_native",
    "--disable-cuda-graph",
    "--sampling-backend",
    "pytorch",
    "--load-format",
    "auto",
    # Without it an idle scheduler busy-polls: an idle pair burned 1.2 of this machine's 2 cores
    # (measured), starving everything else. It sleeps only when every queue is empty (on_idle ->
    # IdleSleeper: a 1 s zmq poll that wakes on the next request), so admission and KV handoff are unchanged.
    "--sleep-on-idle",
)
_CPU_ROLE_FLAGS = {
    # Overlap scheduling reaches torch.cuda.Event() in disaggregation/prefill.py on a prefix-cache hit.
    "prefill": ("--disable-overlap-schedule",),
    # The default host-pool retraction backup calls torch.cuda.cudart().
    "decode": ("--disaggregation-decode-retraction-backup", "cpu_tensor"),
}


def cpu_worker_flags(role: str) -> list[str]:
    """The flags a real SGLang worker of `role` needs on CPU (pool and context are set by the caller)."""
    return [*_CPU_FLAGS, *_CPU_ROLE_FLAGS.get(role, ())]


@dataclass(frozen=True)
class ServerEnv:
    """How to run release `version`'s server on CPU."""

    version: str
    python: str
    pythonpath: tuple[str, ...]
    ld_library_path: tuple[str, ...] = ()

    @property
    def sglang_dir(self) -> Path:
        """The sglang package these workers import (the last PYTHONPATH entry: the release or its copy)."""
        return Path(self.pythonpath[-1]) / "sglang"

    def running(self, site_packages: Path) -> ServerEnv:
        """The same environment running another copy of this release's sglang (e.g. a backported one)."""
        return replace(self, pythonpath=(str(STUB_DIR), str(site_packages)))

    def env(self, base: dict[str, str] | None = None) -> dict[str, str]:
        """The process environment of one server worker."""
        out = dict(os.environ if base is None else base)
        out.pop("PYTHONHOME", None)
        out.update(SERVER_ENV)
        out["PYTHONPATH"] = os.pathsep.join(self.pythonpath)
        if self.ld_library_path:
            inherited = filter(None, [out.get("LD_LIBRARY_PATH")])
            out["LD_LIBRARY_PATH"] = os.pathsep.join([*self.ld_library_path, *inherited])
        return out


#: SGLang's knob (every release 0.5.19-0.5.23, sglang/srt/environ.py): model modules its registry skips.
DISABLED_ARCHS_ENV = "SGLANG_DISABLED_MODEL_ARCHS"


def unused_model_modules(sglang_dir: Path, model_dir: Path) -> tuple[str, ...]:
    """The modules of `sglang_dir`/srt/models that define none of the architectures the model's config.json
    names. SGLang's model registry imports every module there in each scheduler before it picks one (3.5
    of a tiny model's 0.5.22 scheduler's 20 CPU s at start, measured); naming the rest in
    SGLANG_DISABLED_MODEL_ARCHS skips them. () where the config names none or no module defines one:
    SGLang then imports them all, as it would."""
    try:
        archs = json.loads((model_dir / "config.json").read_text())["architectures"]
    except (OSError, ValueError, KeyError, TypeError):
        return ()
    if not isinstance(archs, list) or not archs or not all(isinstance(a, str) and a.isidentifier() for a in archs):
        return ()
    names = "|".join(map(re.escape, archs))
    defines = re.compile(rf"^class (?:{names})\(", re.MULTILINE)
    modules = sorted(p for p in (sglang_dir / "srt" / "models").glob("*.py") if p.stem != "__init__")
    keep = {p.stem for p in modules if defines.search(p.read_text(encoding="utf-8", errors="replace"))}
    return tuple(p.stem for p in modules if p.stem not in keep) if keep else ()


def _server_packages(py: Path) -> None:
    marker = py.parent.parent / ".kvgate-server-complete"
    with locked(root() / "server.lock"):
        if marker.is_file() and marker.read_text() == repr(SERVER_PACKAGES):
            return
        run_step(
            [str(py), "-m", "pip", "install", "-q", *SERVER_PACKAGES],
            pip_env(pins_file()),
            "pip install the sglang server's runtime packages and Mooncake (TCP)",
        )
        write_atomic(marker, repr(SERVER_PACKAGES))


def _system_libs() -> tuple[str, ...]:
    """Folders to add to LD_LIBRARY_PATH for libibverbs/librdmacm; () when the system has them."""
    if all(ctypes.util.find_library(lib) for lib in SYSTEM_LIBS):
        return ()
    dest = root() / "debs"
    marker = dest / ".kvgate-complete"
    with locked(root() / "debs.lock"):
        if not marker.is_file():
            if not shutil.which("apt-get") or not shutil.which("dpkg-deb"):
                raise CpuEnvError(
                    "Mooncake needs libibverbs.so.1 and librdmacm.so.1: install the Debian packages "
                    f"{' '.join(SYSTEM_DEBS[:2])} (apt-get install)"
                )
            if dest.exists():
                shutil.rmtree(dest)
            dl = dest / "download"
            dl.mkdir(parents=True)
            proc = subprocess.run(["apt-get", "download", *SYSTEM_DEBS], cwd=dl, capture_output=True, text=True)
            if proc.returncode != 0:
                raise CpuEnvError(
                    f"apt-get download {' '.join(SYSTEM_DEBS)} failed (run `apt-get update` first, or "
                    f"apt-get install {' '.join(SYSTEM_DEBS[:2])}): {proc.stderr.strip()[-400:]}"
                )
            for deb in sorted(dl.glob("*.deb")):
                run_step(["dpkg-deb", "-x", str(deb), str(dest / "root")], what=f"dpkg-deb -x {deb.name}")
            write_atomic(marker, "ok")
    # libnl-3-200 unpacks into lib/<triplet>, the others into usr/lib/<triplet>: both go on the path.
    found = sorted((dest / "root").glob("usr/lib/*")) + sorted((dest / "root").glob("lib/*"))
    return tuple(str(p) for p in found if p.is_dir())


def server_env(version: str) -> ServerEnv:
    """The CPU server environment of `version`, built on first use (minutes cold, instant warm)."""
    env = cpu_env(version)
    py = base_python()
    _server_packages(py)
    return ServerEnv(
        version=version,
        python=env.python,
        pythonpath=(str(STUB_DIR), str(env.site_packages)),
        ld_library_path=_system_libs(),
    )

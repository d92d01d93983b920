"""Run in every process of kvgate's real SGLang server on CPU (this folder is first on PYTHONPATH).

1. Installs the torchvision STUB (kvgate/backport/_stub/sitecustomize.py; see its docstring), which every
   CPU sglang process needs, the server's spawned subprocesses included.
2. On releases whose Mooncake sender pins host memory for the KV send (0.5.23: `pin_memory=True`, then
   `torch.cuda.Event()` in disaggregation/prefill.py, which crashes without CUDA), sets
   `MooncakeKVSender.supports_host_tensor_indices = False` right after
   `sglang.srt.disaggregation.mooncake.conn` is imported, so the sender takes its plain path (cpu-sglang.md).
   A workaround for running on CPU, not a change of the code under test: the admission, bootstrap,
   transfer and release paths are unchanged.
3. Pauses a scheduler that has no batch to run but is not idle 1 ms per pass of its loop
   (`Scheduler.on_idle`, every release 0.5.19-0.5.23, wrapped right after `sglang.srt.managers.scheduler`
   is imported). SGLang's PD scheduler polls its bootstrap and transfer queues in a loop that "spins
   without sleeping" (its `on_idle`, which returns early while any request waits there): on a GPU host
   a spare core, on this CPU it takes the core the other side's forward pass needs, so a pair under
   load slows itself down. The poll itself is unchanged and runs as before, at most 1 ms later;
   `--sleep-on-idle` (cpuserver.env) covers the fully idle scheduler. Measured: a `kvgate check` of the
   real 0.5.19 pair, its servers' CPU 53.7 s spinning and 40.3 s paused, the same verdict.
   `KVGATE_CPU_SPIN=1` keeps SGLang's own spin.
4. TEST CODE entry, for the real tier only: where KVGATE_TEST_HOOK names a file (tests/real/_late_write.py,
   which injects a late KV write; tests/real/_meta_double_free.py, which double-frees the decode's
   metadata slots), that file's `install(conn)` runs right after the same module. Unset in every
   deployment kvgate starts for users.
"""

from __future__ import annotations

import importlib.abc
import importlib.util
import os
import sys
import time
from types import ModuleType
from typing import Any

_TORCHVISION_STUB = os.path.join(
    os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
    "backport",
    "_stub",
    "sitecustomize.py",
)
_spec = importlib.util.spec_from_file_location("_kvgate_torchvision_stub", _TORCHVISION_STUB)
if _spec is not None and _spec.loader is not None:
    _mod = importlib.util.module_from_spec(_spec)
    _spec.loader.exec_module(_mod)

_MOONCAKE_CONN = "sglang.srt.disaggregation.mooncake.conn"
_SCHEDULER = "sglang.srt.managers.scheduler"
_SPIN_PAUSE_S = 0.001


def _patch_mooncake(module: ModuleType) -> None:
    sender = getattr(module, "MooncakeKVSender", None)
    if sender is not None and hasattr(sender, "supports_host_tensor_indices"):
        sender.supports_host_tensor_indices = False
    hook = os.environ.get("KVGATE_TEST_HOOK")
    if hook:
        spec = importlib.util.spec_from_file_location("_kvgate_test_hook", hook)
        if spec is None or spec.loader is None:
            raise ImportError(f"KVGATE_TEST_HOOK={hook}: not a Python file")
        test_hook = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(test_hook)
        test_hook.install(module)


def _pause_spin(module: ModuleType) -> None:
    scheduler = getattr(module, "Scheduler", None)
    on_idle = getattr(scheduler, "on_idle", None)
    if scheduler is None or on_idle is None or not hasattr(scheduler, "is_fully_idle"):
        return

    def paused_on_idle(self: Any) -> None:
        on_idle(self)
        if not self.is_fully_idle():
            time.sleep(_SPIN_PAUSE_S)

    scheduler.on_idle = paused_on_idle


_PATCHES = {_MOONCAKE_CONN: _patch_mooncake, _SCHEDULER: _pause_spin}


class _PostImportHook(importlib.abc.MetaPathFinder):
    """Wraps the loader of each module of `_PATCHES` so its patch runs right after the module executes."""

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> Any:
        patch = _PATCHES.get(fullname)
        if patch is None:
            return None
        sys.meta_path.remove(self)
        try:
            spec = importlib.util.find_spec(fullname)
        finally:
            sys.meta_path.insert(0, self)
        if spec is None or spec.loader is None:
            return spec
        loader = spec.loader
        exec_module = loader.exec_module

        def exec_and_patch(module: ModuleType) -> None:
            exec_module(module)
            patch(module)

        loader.exec_module = exec_and_patch  # type: ignore[method-assign]
        return spec


if os.environ.get("KVGATE_CPU_SPIN") == "1":
    del _PATCHES[_SCHEDULER]
if os.environ.get("KVGATE_CPU_SERVER") == "1" and not any(isinstance(f, _PostImportHook) for f in sys.meta_path):
    sys.meta_path.insert(0, _PostImportHook())

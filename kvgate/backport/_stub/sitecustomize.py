"""STUB, NOT TORCHVISION: a meta-path finder that serves permissive stand-in modules for `torchvision.*`.

Put on PYTHONPATH (as `sitecustomize`) by kvgate's CPU sglang environments only. Why: sglang's
`srt/utils/common.py` imports `torchvision.io` at top level, and PyPI's torchvision is a CUDA build that
fails to load on CPU torch ("operator torchvision::nms does not exist"). Nothing on the PD admission path
calls torchvision; any attribute of the stub is another stub, so a real call would misbehave loudly
(see shared/reference/cpu-sglang.md).
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
import types
from typing import Any


class _StubMeta(type):
    """Class-level attribute access on a stub class yields another stub class (e.g. an enum member)."""

    def __getattr__(cls, name: str) -> Any:
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        return _stub_class(name)


def _stub_class(name: str) -> type:
    return _StubMeta(name, (), {"__kvgate_stub__": True, "__init__": lambda self, *a, **k: None})


class _StubModule(types.ModuleType):
    """A module whose every missing attribute is another stub (a class, so it can be subclassed)."""

    __path__: list[str] = []  # a package, so `torchvision.io` and friends import

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        stub = _stub_class(name)
        setattr(self, name, stub)
        return stub


class _StubFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Serves `torchvision` and every submodule as a `_StubModule` (labelled `__kvgate_stub__`)."""

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> importlib.machinery.ModuleSpec | None:
        if fullname == "torchvision" or fullname.startswith("torchvision."):
            return importlib.machinery.ModuleSpec(fullname, self, is_package=True)
        return None

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        mod = _StubModule(spec.name)
        mod.__kvgate_stub__ = True  # type: ignore[attr-defined]
        mod.__version__ = "0.0.0+kvgate.stub"  # type: ignore[attr-defined]
        return mod

    def exec_module(self, module: types.ModuleType) -> None:
        return None


if not any(isinstance(f, _StubFinder) for f in sys.meta_path):
    sys.meta_path.insert(0, _StubFinder())

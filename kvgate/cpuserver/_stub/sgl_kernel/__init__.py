"""STUB, NOT sgl_kernel: kvgate's stand-in so the real SGLang server imports on a CPU without sgl_kernel.

Loaded only into the real-server child processes kvgate starts on CPU (never into kvgate itself). Why
(shared/reference/cpu-sglang.md): on a CPU without AMX, SGLang's CPU path only IMPORTS a few `*_cpu`
names (`copy_all_layer_kv_cache_cpu`, `assign_req_to_token_pool_cpu`, speculative-decoding helpers)
under `if _is_cpu:`; every layer then runs plain torch with the `torch_native` attention backend. Each
name served here is a placeholder that raises if it is ever called, so a code path that really needs
the kernel fails loudly instead of computing something wrong. Names that do not end in `_cpu` are not
served (ImportError), so code that probes for an optional kernel takes its fallback.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NoReturn

__version__ = "0.0.0+kvgate.stub"
__kvgate_stub__ = True


def _placeholder(name: str) -> Callable[..., NoReturn]:
    def call(*args: Any, **kwargs: Any) -> NoReturn:
        raise NotImplementedError(f"sgl_kernel.{name} is a kvgate STUB on CPU: this code path needs the real kernel")

    call.__name__ = name
    call.__kvgate_stub__ = True  # type: ignore[attr-defined]
    return call


def __getattr__(name: str) -> Callable[..., NoReturn]:
    if name.endswith("_cpu"):
        fn = _placeholder(name)
        globals()[name] = fn
        return fn
    raise AttributeError(f"module 'sgl_kernel' (kvgate STUB) has no attribute {name!r}")

"""TEST CODE, loaded into a REAL decode worker of the real tier (never into a deployment kvgate gates).

The one hook of the tier's fault pair (tests/real/conftest.py, `decode_fault_pair`): kvgate's CPU-server
`sitecustomize` runs `install(conn)` right after sglang's `disaggregation/mooncake/conn.py` is imported,
when KVGATE_TEST_HOOK names this file, and it installs both decode faults, each driven by its own mode
file and logging to its own folder: `_zero_received_layer.py` (KVGATE_TEST_HANDOFF_DIR,
test_handoff_fault_real.py) and `_meta_double_free.py` (KVGATE_TEST_META_DIR,
test_isolation_fault_real.py). Each is inert while its mode is `off`, so one pair serves both tests and
the tier starts it once. Standard library only: it runs in the release's interpreter.
"""

from __future__ import annotations

import importlib.util
import os
from types import ModuleType

HOOKS = ("_zero_received_layer.py", "_meta_double_free.py")


def install(conn: ModuleType) -> None:
    here = os.path.dirname(os.path.abspath(__file__))
    for name in HOOKS:
        spec = importlib.util.spec_from_file_location(f"_kvgate_test{name[:-3]}", os.path.join(here, name))
        if spec is None or spec.loader is None:
            raise ImportError(f"{name}: not a Python file")
        hook = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(hook)
        hook.install(conn)

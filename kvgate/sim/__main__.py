"""`python -m kvgate.sim worker --disaggregation-mode prefill|decode ...` (see kvgate/sim/worker.py)."""

from __future__ import annotations

import sys


def _main() -> None:
    argv = sys.argv[1:]
    if not argv or argv[0] != "worker":
        sys.stderr.write("usage: python -m kvgate.sim worker --disaggregation-mode prefill|decode [SGLang flags]\n")
        raise SystemExit(2)
    from kvgate.sim.worker import main

    main(argv[1:])


if __name__ == "__main__":
    _main()

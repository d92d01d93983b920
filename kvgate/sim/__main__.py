"""`python -m kvgate.sim worker ...` (one full worker, kvgate/sim/worker.py) or
`python -m kvgate.sim fleet --spec FILE` (many metadata-only workers, kvgate/sim/fleet.py)."""

from __future__ import annotations

import sys


def _main() -> None:
    argv = sys.argv[1:]
    if argv and argv[0] == "fleet":
        from kvgate.sim.fleet import main as fleet_main

        fleet_main(argv[1:])
        return
    if not argv or argv[0] != "worker":
        sys.stderr.write(
            "usage: python -m kvgate.sim worker --disaggregation-mode prefill|decode [SGLang flags]\n"
            "       python -m kvgate.sim fleet --spec FILE\n"
        )
        raise SystemExit(2)
    from kvgate.sim.worker import main

    main(argv[1:])


if __name__ == "__main__":
    _main()

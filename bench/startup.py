"""Start-up cost of `kvgate --help` as a ratio of a two-command hello-world Typer app's `--help` (goal <= 1.3),
and of the single file `dist/kvgate --help` as a ratio of the installed kvgate's (goal <= 1.3).

All run side by side in this one process, interleaved, with the same interpreter; the CPU time
(user + system) of each child comes from the kernel (os.wait4), so other load on the machine moves
wall time but barely moves it. With `--binary dist/kvgate` the single-file build is measured too,
run by the interpreter the venv was made from (no venv on its path, as on a CI runner); `--python`
adds other interpreters (3.10-3.13), each against the installed kvgate. The file's first run
unpacks it and is not counted: a warm-up run of every command precedes the samples.

    .venv/bin/python bench/startup.py [--runs 15] [--binary dist/kvgate [--python PY ...]] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

GOAL = 1.3
ROOT = Path(__file__).resolve().parent.parent

HELLO = '''
import typer

app = typer.Typer()


@app.command()
def hello(name: str = "world") -> None:
    """Say hello."""
    print(f"hello {name}")


@app.command()
def bye(name: str = "world") -> None:
    """Say bye."""
    print(f"bye {name}")


app()
'''


def cpu_seconds(argv: list[str], env: dict[str, str]) -> float:
    """User + system CPU seconds of one child run; it must exit 0."""
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env)
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(argv)} exited {proc.returncode}: {proc.stderr.read().decode()[-500:]}")  # type: ignore[union-attr]
    return usage.ru_utime + usage.ru_stime


def base_python() -> str:
    """The interpreter this venv was made from (the installed kvgate's own Python, without the venv)."""
    base = getattr(sys, "_base_executable", None) or sys.executable
    return base


def measure(runs: int, binary: str | None, pythons: list[str] | None = None) -> dict[str, object]:
    env = dict(os.environ)
    env.setdefault("PYTHONPATH", str(ROOT))
    env.pop("PYTHONDONTWRITEBYTECODE", None)  # any value, even "0", stops .pyc writes: every run would compile
    with tempfile.TemporaryDirectory() as tmp:
        hello = Path(tmp) / "hello.py"
        hello.write_text(HELLO)
        cmds: dict[str, tuple[list[str], dict[str, str]]] = {
            "hello-world typer --help": ([sys.executable, str(hello), "--help"], env),
            "kvgate --help": ([sys.executable, "-c", "from kvgate.cli import main; main()", "--help"], env),
        }
        # The file on each interpreter, and beside it the same packages installed on that interpreter
        # (its unpacked site on sys.path, no launcher): the ratio of the two is what the file costs.
        bare = {k: v for k, v in env.items() if k != "PYTHONPATH"}
        bare["KVGATE_BIN_ROOT"] = str(Path(tmp) / "bin")
        pairs: dict[str, tuple[str, str]] = {}
        for py in [base_python(), *(pythons or [])] if binary else []:
            ver = subprocess.run(
                [py, "-c", "import sys; print('%d.%d' % sys.version_info[:2])"], capture_output=True, text=True
            ).stdout.strip()
            name = f"dist/kvgate --help ({ver})"
            if name in cmds:
                continue
            cpu_seconds([py, str(binary), "--version"], bare)  # unpacks it
            (site,) = (Path(tmp) / "bin").glob("kvgate-*")
            code = f"import sys; sys.path.insert(0, {str(site)!r}); from kvgate.cli import main; main()"
            cmds[name] = ([py, str(binary), "--help"], bare)
            cmds[f"installed kvgate --help ({ver})"] = ([py, "-c", code, "--help"], bare)
            pairs[name] = (f"installed kvgate --help ({ver})", ver)
        samples: dict[str, list[float]] = {k: [] for k in cmds}
        for argv, e in cmds.values():  # warm-up: byte-compile, page cache, unpack the zipapp
            cpu_seconds(argv, e)
        for _ in range(runs):
            for name, (argv, e) in cmds.items():
                samples[name].append(cpu_seconds(argv, e))
    med = {k: statistics.median(v) for k, v in samples.items()}
    base = med["hello-world typer --help"]
    installed = med["kvgate --help"]
    return {
        "runs": runs,
        "median_cpu_s": {k: round(v, 4) for k, v in med.items()},
        "ratio": {"kvgate --help": round(installed / base, 3)},
        # the file against the same packages installed on the same interpreter
        "ratio_to_installed": {k: round(med[k] / med[inst], 3) for k, (inst, _) in pairs.items()},
        # the file against the project's own venv install (typer 0.29, the venv's interpreter)
        "ratio_to_venv_install": {k: round(med[k] / installed, 3) for k in pairs},
        "goal": GOAL,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=15)
    ap.add_argument("--binary", default=None, help="also measure this single-file build")
    ap.add_argument(
        "--python", action="append", default=[], help="also run the single file with this interpreter (repeatable)"
    )
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    result = measure(args.runs, args.binary, args.python)
    if args.json:
        print(json.dumps(result))
        return
    for name, secs in result["median_cpu_s"].items():  # type: ignore[union-attr]
        print(f"{name:32s} {secs * 1000:7.1f} ms CPU (median of {args.runs})")
    for name, ratio in result["ratio"].items():  # type: ignore[union-attr]
        verdict = "meets" if ratio <= GOAL else "MISSES"
        print(f"{name:32s} {ratio:.2f}x the hello-world app ({verdict} the {GOAL}x goal)")
    for name, ratio in result["ratio_to_installed"].items():  # type: ignore[union-attr]
        verdict = "meets" if ratio <= GOAL else "MISSES"
        print(f"{name:32s} {ratio:.2f}x kvgate installed on that Python ({verdict} the {GOAL}x goal)")
    for name, ratio in result["ratio_to_venv_install"].items():  # type: ignore[union-attr]
        print(f"{name:32s} {ratio:.2f}x the venv's installed kvgate --help")


if __name__ == "__main__":
    main()

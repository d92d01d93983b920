"""Time of kvgate's code scan over an installed sglang tree, as a ratio of `grep -r`.

Both run side by side in one process, on a warm page cache, for the same strings: every signature of
the catalogue and every backport file's code signature (substrings as fixed strings, regexes as extended
regexes), plus the backport marker. kvgate's scan (what `fixes --site-packages` and `--python` run)
reads and hashes the named files plus one pass over every .py file for globs and markers, and reads
as Python tokens (comments and strings found) each file whose bytes carry a signature, so that only code
counts; grep reads the whole tree and matches text. The three run in turn each round (a busy machine
slows all three alike), and the median of each is compared.
Goal: ratio <= 0.5 against `grep -r --include=*.py` (0.46 measured before the scan read tokens). It also
prints the CPU time each side used (the scan's own process time, grep's as a child), least of the runs: on a
loaded machine wall time swings with the neighbours, CPU time much less.

    .venv/bin/python bench/fixes_signature_scan.py [--release 0.5.23 | --path SITE_PACKAGES] [--repeat 5]
"""

from __future__ import annotations

import argparse
import re
import resource
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

from kvgate.catalogue import load_catalogue
from kvgate.catalogue.codescan import all_series, scan_site_packages
from kvgate.catalogue.scanprog import MARKER_PREFIX
from kvgate.upstream.releases import unpacked_wheel


def _grep_patterns() -> list[str]:
    """Every catalogue signature as a POSIX extended regex (GNU grep -E)."""
    out = []
    fixed = [c for s in all_series() for p in s.patches for f in p.files for c in f.code] + [MARKER_PREFIX]
    for fix in load_catalogue().fixes:
        for sig in fix.signatures:
            if sig.substring is not None:
                fixed.append(sig.substring)
            else:
                out.append(str(sig.regex))
    return out + [re.sub(r"([][.*+?(){}|^$\\])", r"\\\1", f) for f in dict.fromkeys(fixed)]


def _time(fn, repeat: int) -> float:  # type: ignore[no-untyped-def]
    samples = []
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - t)
    return statistics.median(samples)


def _cpu(fn, child: bool, repeat: int) -> float:  # type: ignore[no-untyped-def]
    """Least CPU seconds of `repeat` runs: this process's own, or its children's (grep)."""
    best = float("inf")
    for _ in range(repeat):
        if child:
            r0 = resource.getrusage(resource.RUSAGE_CHILDREN)
            fn()
            r1 = resource.getrusage(resource.RUSAGE_CHILDREN)
            used = (r1.ru_utime - r0.ru_utime) + (r1.ru_stime - r0.ru_stime)
        else:
            t = time.process_time()
            fn()
            used = time.process_time() - t
        best = min(best, used)
    return best


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--release", default="0.5.23", help="real sglang wheel to unpack and scan")
    ap.add_argument("--path", help="a site-packages folder holding sglang/ (instead of --release)")
    ap.add_argument("--repeat", type=int, default=5)
    args = ap.parse_args()
    site = Path(args.path) if args.path else unpacked_wheel(args.release)
    cat = load_catalogue()
    pkg = scan_site_packages(site, cat).package_dir
    with tempfile.NamedTemporaryFile("w", suffix=".txt", delete=False) as fh:
        fh.write("\n".join(_grep_patterns()) + "\n")
        patfile = fh.name

    def kvgate_scan() -> None:
        scan_site_packages(site, cat)

    def grep(*extra: str):  # type: ignore[no-untyped-def]
        def run() -> None:
            # -l like kvgate (a file is done at its first hit per pattern set); exit 1 (no match) is fine
            subprocess.run(
                ["grep", "-r", "-l", "-E", "-f", patfile, *extra, str(pkg)],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                check=False,
            )

        return run

    grep_py, grep_all = grep("--include=*.py"), grep()
    for fn in (kvgate_scan, grep_py, grep_all):  # warm the page cache
        fn()
    samples: dict[str, list[float]] = {"k": [], "py": [], "all": []}
    for _ in range(args.repeat):
        for key, fn in (("k", kvgate_scan), ("py", grep_py), ("all", grep_all)):
            samples[key].append(_time(fn, 1))
    t_k, t_py, t_all = (statistics.median(samples[k]) for k in ("k", "py", "all"))
    n_py = sum(1 for _ in pkg.rglob("*.py"))
    print(f"tree: {pkg} ({n_py} .py files); {len(_grep_patterns())} patterns; median of {args.repeat}")
    print(f"kvgate code scan           : {t_k * 1000:8.1f} ms")
    print(f"grep -r --include=*.py     : {t_py * 1000:8.1f} ms   ratio kvgate/grep = {t_k / t_py:.2f}")
    print(f"grep -r (every file)       : {t_all * 1000:8.1f} ms   ratio kvgate/grep = {t_k / t_all:.2f}")
    c_k, c_py = _cpu(kvgate_scan, False, args.repeat), _cpu(grep_py, True, args.repeat)
    print(
        f"CPU time, least of {args.repeat}: kvgate {c_k * 1000:.1f} ms, grep -r --include=*.py {c_py * 1000:.1f} ms, "
        f"ratio {c_k / c_py:.2f}"
    )
    print(f"ratio {t_k / t_py:.2f} (goal <= 0.5): {'met' if t_k / t_py <= 0.5 else 'NOT met'}")
    Path(patfile).unlink()


if __name__ == "__main__":
    main()

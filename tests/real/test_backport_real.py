"""Issue 21's proof on the real server: a real 0.5.20 PD pair started from the BACKPORTED tree passes.

The pair is CI's healthy 0.5.20 shape (`0.5.20-healthy-ids-4k-llama` of conftest.py: 4k context, pools
1.25 x context on both sides, `--skip-tokenizer-init`, the tiny Llama), started by kvgate's launcher from
a private copy of the release's cached CPU install that `kvgate backport --to v0.5.20 --site-packages`
(the real CLI, in process) patched. `kvgate check` with NO profile, reading that copy's code, must give
exit 0: every correctness fix present or stood in for, every probe passed.

That the workers really run the patched copy is read from what they did, not from a label: the compiled
bytecode of every patched module the Mooncake PD path imports is removed from the copy before the start
and must be there after it, compiled from the PATCHED source (the .pyc header records the source's mtime
and size); only the server processes import sglang from the copy (kvgate reads it as text). The
behaviour says the same: on the unpatched tree this very shape hangs a request in the 6-token abort
band (no sglang#38935), here contract.pool_limit must pass.

The same pair from the UNPATCHED tree is CI's `0.5.20-healthy-ids-4k-llama` in test_verdicts.py: exit 1
with `defenses.release` failed, naming the fixes this series stands in for.

The page-lifetime race itself, on the real server (lifetime_race.py: a KV send that fails while its
write is still in flight, injected by TEST code into the real prefill), first on each release's healthy
CI pair as it ships: on 0.5.20 (and 0.5.19, 0.5.21) decode hands the failed request's pages to the next
request and the late write lands in them (NOT RETIRED, the next answer changes); on 0.5.22 and 0.5.23,
and on the backported 0.5.20 pair, decode holds them, the next request gets other pages, the write lands
in the held ones (RETIRED, the answer unchanged) and the hold ends on decode's 30 s timeout (the poisoned
send is never ACKed), before the pair's next test or `kvgate check` runs.
"""

from __future__ import annotations

import dataclasses
import struct
from pathlib import Path

import pytest
from typer.testing import CliRunner

from kvgate.backport.cpuenv import copy_site_packages, cpu_env
from kvgate.catalogue.series import load_series
from kvgate.cli import app
from kvgate.deploy.launch import PDDeployment
from tests.assets.real_sglang import server_env_or_skip
from tests.real.conftest import RACE_OUTCOME, RACE_SPEC, RACE_SPECS, STOOD_IN_0_5_20, RealPair, plan_for, report_of
from tests.real.lifetime_race import provoke, wait_for_hold_end

pytestmark = [pytest.mark.slow, pytest.mark.real]
runner = CliRunner()

SPEC = RACE_SPEC  # the shape of CI's unpatched healthy 0.5.20
HOLD_END_S = 300.0  # outer safety net for decode's 30 s deferred-release timeout (its line is awaited)
# Patched files a Mooncake PD worker never imports (the NIXL backend's connection module).
NOT_ON_THE_MOONCAKE_PATH = ("sglang/srt/disaggregation/nixl/conn.py",)


def _patched_modules(site: Path) -> list[Path]:
    """The files of the default series (opt-in hardening not applied) that a Mooncake PD worker imports."""
    series = load_series("v0.5.20")
    assert {p.id for p in series.select(with_hardening=False)} == set(STOOD_IN_0_5_20.values())
    paths = {pf.site_path for p in series.select(with_hardening=False) for pf in p.files}
    return [site / p for p in sorted(paths) if p not in NOT_ON_THE_MOONCAKE_PATH]


def _bytecode(source: Path) -> list[Path]:
    """`source`'s cached bytecode, whatever interpreter wrote it (the servers' may differ from pytest's)."""
    return sorted((source.parent / "__pycache__").glob(f"{source.stem}.*.pyc"))


def _compiled_from(source: Path) -> bool:
    """Whether cached bytecode of `source` exists that was compiled from this very source (mtime, size)."""
    st = source.stat()
    for pyc in _bytecode(source):
        flags, mtime, size = struct.unpack("<III", pyc.read_bytes()[4:16])
        if flags == 0 and mtime == int(st.st_mtime) & 0xFFFFFFFF and size == st.st_size & 0xFFFFFFFF:
            return True
    return False


def test_late_write_race_on_each_release_as_shipped(real_pair: RealPair) -> None:
    """The race on each release's own code (conftest.RACE_OUTCOME); 0.5.20's is the backport's unpatched half."""
    if real_pair.spec not in RACE_SPECS:
        pytest.skip("the race is provoked on each release's healthy CI pair")
    assert real_pair.tests_done == 0, "the race needs the pair's fresh pools: it must be the pair's first test"
    assert real_pair.hook_dir is not None
    spec = real_pair.spec
    race = provoke(real_pair.router, real_pair.hook_dir, real_pair.decode_log, spec.decode_pool)
    assert race.outcome == RACE_OUTCOME[spec.release], race.describe()
    assert race.failed_room is not None, race.describe()
    if race.outcome == "NOT RETIRED":
        assert race.answer_changed, race.describe()  # the next request answered from the failed request's KV
        # Not held until the write could no longer land: no hold of the room ended on decode's timeout.
        assert wait_for_hold_end(real_pair.decode_log, race.failed_room, 0.0) is None, race.describe()
    else:
        assert not race.answer_changed, race.describe()
        # The pair's next tests need its whole pool: the hold (a poisoned send is never ACKed) ends on the timeout.
        hold_end = wait_for_hold_end(real_pair.decode_log, race.failed_room, HOLD_END_S)
        assert hold_end is not None, f"decode never ended its hold of room {race.failed_room}: {race.describe()}"


def test_backported_0_5_20_pair_passes_check_at_the_defaults(tmp_path: Path) -> None:
    server_env_or_skip(SPEC.release)
    site = copy_site_packages(cpu_env(SPEC.release), tmp_path / "site-0.5.20").site_packages
    applied = runner.invoke(app, ["backport", "--release", "v0.5.20", "--site-packages", str(site)])
    assert applied.exit_code == 0, applied.output
    modules = _patched_modules(site)
    assert len(modules) >= 6, modules
    for source in modules:
        for pyc in _bytecode(source):
            pyc.unlink()
    assert not [m for m in modules if _compiled_from(m)]

    plan = plan_for(SPEC, hook_dir=tmp_path / "late-write")
    # The workers may write bytecode (this machine's shells set PYTHONDONTWRITEBYTECODE): the evidence above.
    plan = dataclasses.replace(plan, site_packages=str(site), env={**plan.env, "PYTHONDONTWRITEBYTECODE": ""})
    dep = PDDeployment(plan, log_dir=tmp_path / "logs")
    dep.start()
    try:
        pair = RealPair(SPEC, dep)
        assert dep.code_sources()["*"]["site_packages"] == str(site)
        not_run = [str(m.relative_to(site)) for m in modules if not _compiled_from(m)]
        assert not not_run, f"the workers did not import the patched copy of {not_run}"
        # The race first, on the fresh pools; the check once decode has ended the hold it causes.
        race = provoke(pair.router, tmp_path / "late-write", pair.decode_log, SPEC.decode_pool)
        assert race.outcome == "RETIRED", race.describe()
        assert not race.answer_changed, race.describe()
        assert race.failed_room is not None, race.describe()
        hold_end = wait_for_hold_end(pair.decode_log, race.failed_room, HOLD_END_S)
        assert hold_end is not None, f"decode never ended its hold of room {race.failed_room}: {race.describe()}"
        out = tmp_path / "patched.json"
        res = runner.invoke(app, [*pair.check_args(), "-f", "json", "-o", str(out), "-q"])
        assert out.is_file(), res.output
        report = report_of(out)
    finally:
        dep.stop()
    not_passed = [
        f"{f['outcome']} {f['gate']}.{f['check']}: {f['summary'][:600]}"
        for f in report["findings"]
        if f["outcome"] not in ("passed", "info")
    ]
    assert res.exit_code == 0, "\n".join(not_passed) or res.output
    assert not not_passed, not_passed
    releases = [f for f in report["findings"] if (f["gate"], f["check"]) == ("defenses", "release")]
    assert len(releases) >= 2, releases  # one per worker: the prefill and the decode
    for f in releases:
        assert f["outcome"] == "passed", f
        rows = {e["field"]: str(e["value"]) for e in f["evidence"]}
        for fix, patch in STOOD_IN_0_5_20.items():
            assert rows[fix].startswith("present") and f"by kvgate backport {patch}" in rows[fix], (fix, rows[fix])
    # The abort band that hangs on the unpatched tree (no #38935) is answered here.
    contract = [f for f in report["findings"] if f["check"] == "contract.pool_limit"]
    assert contract and all(f["outcome"] == "passed" for f in contract), contract

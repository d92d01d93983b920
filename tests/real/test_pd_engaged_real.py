"""`probes.pd.engaged` against the REAL smg in regular (non-PD) mode in front of a real pair's workers.

The pair's own PD router is left as it is; a second smg 1.13.0 is started in regular mode
(`--worker-urls PREFILL DECODE`: each request goes to one worker, none through a prefill and a KV
transfer) and `kvgate check` is pointed at it. The verdict must not pass as PD. Run on one pair only
(the router, not the release, is what is tested); its healthy-path twin, the pair's own PD router
passing `probes.pd.*` from the real workers' counters, is test_verdicts.py's healthy check.
"""

from __future__ import annotations

import socket
import time
from pathlib import Path

import httpx
import pytest
import yaml
from typer.testing import CliRunner

from kvgate.cli import app
from kvgate.deploy.pdstart import find_smg
from kvgate.deploy.supervisor import Supervisor
from tests.real.conftest import IDS, PairSpec, RealPair, report_of

pytestmark = [pytest.mark.slow, pytest.mark.real]
SPEC = PairSpec("0.5.22", "healthy", IDS, 8192, "qwen2")
# What is judged here is where the answers came from, not the releases' limits: the costly phases off.
CHEAP = {"abort_probe": False, "isolation_probe": False, "load_probe": False, "deadline_s": 20, "tenants": 4}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_a_regular_mode_router_in_front_of_real_workers_does_not_pass_as_pd(
    real_pair: RealPair, tmp_path: Path
) -> None:
    if real_pair.spec != SPEC:
        pytest.skip(f"run on {SPEC.id} only")
    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    argv = [
        find_smg(),
        "launch",
        "--worker-urls",
        real_pair.prefill,
        real_pair.decode,
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--prometheus-port",
        str(_free_port()),
        "--prometheus-host",
        "127.0.0.1",
        "--worker-startup-check-interval",
        "1",
        "--disable-retries",
        "--disable-circuit-breaker",
        "--log-level",
        "warn",
    ]
    with Supervisor(log_dir=tmp_path, grace_s=5.0) as sup:
        sup.start("regular-router", argv)
        deadline = time.monotonic() + 180
        listed = 0
        with httpx.Client(timeout=5) as c:
            while listed < 2 and time.monotonic() < deadline:
                try:
                    listed = len(c.get(url + "/workers").json().get("workers", []))
                except (httpx.HTTPError, ValueError, AttributeError):
                    pass
                time.sleep(1.0)
        assert listed == 2, f"the regular-mode router did not list both workers; log: {tmp_path}"
        profile = tmp_path / "cheap.yaml"
        profile.write_text(yaml.safe_dump({"schema": 1, "name": "cheap", "probes": CHEAP}))
        out = tmp_path / "regular.json"
        args = ["check", "--prefill-url", real_pair.prefill, "--decode-url", real_pair.decode, "--router-url", url]
        res = CliRunner().invoke(app, [*args, "--no-strict", "--profile", str(profile), "-f", "json", "-o", str(out)])
        assert out.is_file(), res.output
        report = report_of(out)
    engaged = [f for f in report["findings"] if (f["gate"], f["check"]) == ("probes", "pd.engaged")]
    assert len(engaged) == 1, [f["check"] for f in report["findings"]]
    assert engaged[0]["outcome"] == "failed", engaged[0]
    assert res.exit_code == 1, (res.exit_code, engaged[0]["summary"])
    print("\nregular mode:", engaged[0]["summary"])
    for e in engaged[0]["evidence"]:
        print("   ", e["node"], e["field"], e["value"])

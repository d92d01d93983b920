"""What the real server does with `--disaggregation-enable-kv-checksum` off CUDA (issue: defenses on real code).

The defenses gate claims the KV checksum counts only on CUDA (it is a CUDA kernel over GPU page
indices) and reports a non-CUDA deployment as "not counted". Measured on the real 0.5.22 server on
this CPU: the prefill dies at its first KV send (the start-up warm-up request), on
`assert kv_page_indices_gpu.is_cuda` in `sglang/srt/disaggregation/checksum.py`, so the pair never
becomes ready. The claim holds; the flag on a CPU deployment is no defense, it is an outage.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from kvgate.deploy.launch import PDDeployment, PDLaunchPlan
from kvgate.deploy.supervisor import SupervisorError
from tests.assets.real_sglang import server_env_or_skip

pytestmark = [pytest.mark.slow, pytest.mark.real]


def test_kv_checksum_off_cuda_kills_the_prefill_at_its_first_send(tmp_path: Path) -> None:
    server_env_or_skip("0.5.22")
    plan = PDLaunchPlan(
        model_path=None,
        engine="sglang",
        device="cpu",
        release="0.5.22",
        context_length=8192,
        prefill_max_total_tokens=10240,
        decode_max_total_tokens=10240,
        ready_deadline_s=600.0,
        extra_worker_args=("--disaggregation-enable-kv-checksum",),
    )
    dep = PDDeployment(plan, log_dir=tmp_path)
    with pytest.raises(SupervisorError) as exc:
        dep.start()
    dep.stop()
    log = (tmp_path / "prefill0.log").read_text(errors="replace")
    assert "disaggregation/checksum.py" in log and "is_cuda" in log, str(exc.value)

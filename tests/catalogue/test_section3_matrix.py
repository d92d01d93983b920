"""Every row of upstream-fixes.md section 3, as written there, against the real wheels.

The catalogue entries reuse most rows; this test also covers the rows that are not entries of their
own (the 0.5.21-only Mooncake form of #40645, the capability attribute, the bootstrap_room check), so
the scanner and the reference table are checked against each other row by row.
"""

from __future__ import annotations

import pytest

from kvgate.catalogue.model import Fix, Signature
from kvgate.catalogue.signatures import DirTree
from kvgate.upstream.releases import RELEASES
from tests.catalogue.helpers import wheel

pytestmark = pytest.mark.wheels

D = "srt/disaggregation/"
S = Signature
# (row, signatures (all must match), releases with the row: index range into RELEASES)
ROWS: list[tuple[str, tuple[Signature, ...], tuple[str, ...]]] = [
    (
        "#35049 deferred release (machinery)",
        (
            S("srt/environ.py", "SGLANG_DISAGGREGATION_DEFERRED_DECODE_KV_RELEASE = EnvBool("),
            S(D + "decode.py", "def _defer_release("),
        ),
        RELEASES,
    ),
    ("#35360 NIXL deferred", (S(D + "nixl/conn.py", "enable_deferred_decode_kv_release"),), RELEASES),
    (
        "#37454 capability gate",
        (S(D + "base/conn.py", regex=r"^    enable_deferred_decode_kv_release: bool = False"),),
        RELEASES[1:],
    ),
    ("#36612 failure notification", (S(D + "common/conn.py", "def conclude_failure("),), RELEASES[1:]),
    (
        "#36988 retire aborted results",
        (
            S(D + "prefill.py", "def _retire_aborted_prefill_result("),
            S(D + "prefill.py", "Failed to notify KV sender of abort for", context="string"),
        ),
        RELEASES[1:],
    ),
    (
        "#38935 admission door",
        (
            S(D + "utils.py", "def is_unadmitted_reject("),
            S(D + "prefill.py", "if is_unadmitted_reject(req):"),
            S(D + "decode.py", "and is_unadmitted_reject(req)"),
            S("srt/managers/scheduler.py", "def retire_unadmitted_request("),
        ),
        RELEASES[2:],
    ),
    (
        "#39500 KV checksum",
        (
            S("srt/arg_groups/fields/disagg.py", "disaggregation_enable_kv_checksum:"),
            S(D + "checksum.py", "class KvChecksumComputer"),
            S(D + "decode.py", "def _verify_kv_checksums("),
            S(D + "decode.py", '"KV checksum mismatch"', context="string"),
            S("kernels/ops/memory/adler32.py", "def adler32_strided_checksum"),
        ),
        RELEASES[2:],
    ),
    (
        "checksum safety",
        (
            S(D + "utils.py", "def kv_layout_signature("),
            S(D + "decode.py", "def _kv_checksum_comparable("),
            S(D + "base/conn.py", "def should_verify_kv_checksum("),
            S(D + "decode.py", "KV checksum skipped: prefill layout signature", context="string"),
            S(D + "utils.py", "def all_reduce_flags("),
        ),
        RELEASES[4:],
    ),
    (
        "#40645 preserve ACK (generic)",
        (S(D + "common/conn.py", "self.kv_mgr._maybe_ack_drained_abort(self.bootstrap_room)"),),
        RELEASES[2:],
    ),
    (
        "#40645 Mooncake late-abort (0.5.21 form)",
        (S(D + "mooncake/conn.py", "or self._staging_outstanding.get(room_to_be_aborted, 0) > 0"),),
        ("0.5.21",),
    ),
    (
        "#41402 ACK fan-out",
        (S(D + "common/conn.py", regex=r"def (_abort_ack_fanout_targets|_send_abort_acks)\("),),
        RELEASES[2:],
    ),
    (
        "#41023 default on",
        (S("srt/environ.py", "SGLANG_DISAGGREGATION_DEFERRED_DECODE_KV_RELEASE = EnvBool(True)"),),
        RELEASES[2:],
    ),
    ("capability attr", (S(D + "base/conn.py", "supports_deferred_decode_kv_release: bool = False"),), RELEASES[2:]),
    ("Mori supports deferred", (S(D + "mori/conn.py", "supports_deferred_decode_kv_release = True"),), RELEASES[3:]),
    (
        "#41404 force-arm on failure",
        (
            S(D + "decode.py", "ensure_abort_notified(force_arm=True)"),
            S(D + "common/conn.py", "def ensure_abort_notified(self, *, force_arm: bool = False)"),
        ),
        RELEASES[2:],
    ),
    ("#38704 slot-7 coverage (open)", (S(D + "utils.py", regex=r"cached_tokens\[[^\]]*\]\[7\]\s*="),), ()),
    ("#30325 (open)", (S(D + "prefill.py", "max_req_input_len"),), ()),
    (
        "bootstrap_room check (pre-existing)",
        (S(D + "decode.py", "Metadata corruption detected - bootstrap_room mismatch", context="string"),),
        RELEASES,
    ),
    ("KV canary subsystem", (S("srt/kv_canary/api.py", "def install_canary("),), RELEASES),
]


def _fix(i: int, sigs: tuple[Signature, ...]) -> Fix:
    return Fix(
        id=f"row{i}",
        number=None,
        kind="change",
        title="",
        state="n/a",
        state_evidence="W",
        failure_class="detection",
        first_release=None,
        first_release_bound="exact",
        correctness=False,
        signatures=sigs,
    )


@pytest.mark.parametrize("release", RELEASES)
def test_every_section3_row(release: str) -> None:
    results = DirTree(wheel(release) / "sglang").scan(_fix(i, sigs) for i, (_, sigs, _) in enumerate(ROWS))
    for i, (row, _, releases) in enumerate(ROWS):
        r = results[f"row{i}"]
        assert (r.presence.value == "present") == (release in releases), (release, row, r.evidence())

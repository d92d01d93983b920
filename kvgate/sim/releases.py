"""Per-release behaviour of the simulated SGLang workers, one class per emulated release.

Each class is a separate, documented code path for the points where releases differ for isolation
(shared/reference/upstream-fixes.md sections 2, 5-7; paths are relative to the sglang wheel root):

* 0.5.19: no admission door, aborted prefill results are not retired: a request rejected by
  `managers/utils.py validate_input_length` still gets `Req.set_finish_with_abort` semantics only
  (`to_finish` set, input replaced by `[0]`, `Req.finished()` false), so it is bootstrapped, forwarded
  and its one-token KV is sent with a transfer-complete (`disaggregation/prefill.py
  SchedulerDisaggregationPrefillMixin.process_disagg_prefill_inflight_queue` sets
  `FINISH_LENGTH(0)` on `KVPoll.Success`). Late chunks of an aborted request keep being sent.
* 0.5.20 (#36988): `process_batch_result_disagg_prefill` retires the aborted result after the forward
  (`_retire_aborted_prefill_result`): no KV, no transfer-complete; the prefill client gets the 400,
  the decode is not told and waits for `SGLANG_DISAGGREGATION_WAITING_TIMEOUT`
  (`common/conn.py CommonKVReceiver._check_waiting_timeout`), then fails with 500
  (`decode.py DecodeTransferQueue.pop_transferred`). Later chunks of retired requests are not sent.
* 0.5.21 (#38935, #41023, #40645, #39500): `PrefillBootstrapQueue.add` / `DecodePreallocQueue.add`
  retire `is_unadmitted_reject` requests at the door (`Scheduler.retire_unadmitted_request`) with
  their original 400, before bootstrap; deferred decode KV release is on by default; abort ACKs are
  kept until in-flight writes drain; the KV-checksum flag exists.
* 0.5.22: `internal_states[i].disaggregation_mode` (and decode CUDA-graph keys) appear.
* 0.5.23: `hicache_object_layout`, `disaggregation_decode_allocation_policy`, `enable_pd_role_switch`.

A door retire tells the decode nothing, on every release and with kvgate's backport alike: the
prefill never created a sender for the room, so no KV, no transfer-complete and no failure status
reaches the decode. The decode that admitted the request (its own limit is larger) keeps its
reservation and waits for the KV until SGLANG_DISAGGREGATION_WAITING_TIMEOUT (300 s), then fails it
with a 500. The real 0.5.21 and 0.5.23 servers (CPU, behind smg 1.13.0) showed exactly that: a
non-streaming client still got the prefill's 400 at once (smg answers with the first error), a
streaming one, whose answer smg relays from the decode, hung. The simulator once modelled a failure
notification here (#36612's `CommonKVManager.conclude_failure`, as the issue and #38935's 1P1D
comparison describe); the real servers sent none, so the simulator sends none either.
"""

from __future__ import annotations

from typing import Any

from kvgate.upstream.releases import DEFERRED_RELEASE_DEFAULT, RELEASES


class SimRelease:
    """The behaviour of one emulated release at every point where releases differ for isolation.

    The base type every caller holds (a release class or `KvgateBackport`). Its defaults are the
    oldest behaviour kvgate emulates (0.5.19's, the leaky baseline); each release class overrides what
    its release changed, citing the code.
    """

    version: str
    #: `/ready` was added in 0.5.20 (`entrypoints/http_server.py ready`).
    has_ready_endpoint = False
    #: `--disaggregation-enable-kv-checksum` (a server arg, reported in server_info) from 0.5.21.
    has_kv_checksum_flag = False
    #: `--disaggregation-decode-allocation-policy` and `--enable-pd-role-switch` from 0.5.23.
    has_decode_allocation_args = False
    #: kvgate ships a backport series for this release (`backports/v<release>/`): 0.5.19 and 0.5.20.
    has_kvgate_backport = True

    @property
    def deferred_release_default(self) -> bool:
        """`srt/environ.py SGLANG_DISAGGREGATION_DEFERRED_DECODE_KV_RELEASE`'s default in this release:
        kept once, in `kvgate.upstream.releases.DEFERRED_RELEASE_DEFAULT` (checked against every wheel)."""
        return DEFERRED_RELEASE_DEFAULT[self.version]

    def admission_door_rejects(self, aborted: bool, holds_resources: bool) -> bool:
        """`PrefillBootstrapQueue.add` / `DecodePreallocQueue.add`: no abort check before 0.5.21."""
        return False

    def retires_aborted_result_after_forward(self) -> bool:
        """`process_batch_result_disagg_prefill` consults `is_aborted` for middle chunks only in 0.5.19."""
        return False

    def stops_late_chunks_after_abort(self) -> bool:
        """Before #36988 a decode abort does not stop the prefill's remaining chunk sends.

        Simulator choice (the leaky worst case issue 3 asks for): the published 0.5.19 wheel's
        `mooncake/conn.py` already fails the room on the decode's abort notification, after which
        `add_transfer_request` posts nothing and `transfer_worker` skips queued chunks; the simulator
        keeps sending here nonetheless."""
        return False

    def acks_abort_after_drain(self) -> bool:
        """`common/conn.py CommonKVSender.clear` pops the deferred ACK target unconditionally before
        #40645, so the ACK is lost and a deferring decode only frees on its hold timeout."""
        return False

    def validates_transfer_coverage(self) -> bool:
        """Decode-side check that the claimed transfer covers the reservation: in no release (#38704)."""
        return False

    def server_info_extra(self, mode: str) -> dict[str, Any]:
        """Top-level `/server_info` keys that only some releases have."""
        return {"kv_events": None}

    def internal_state_extra(self, mode: str) -> dict[str, Any]:
        """Keys of `internal_states[i]` that only some releases have."""
        return {}

    def model_info_extra(self, mode: str) -> dict[str, Any]:
        """Keys of `/model_info` that only some releases have."""
        return {}


class Release0519(SimRelease):
    """sglang 0.5.19: the leaky baseline (no #36988, no #38935, deferred release off by default)."""

    version = "0.5.19"


class Release0520(Release0519):
    """sglang 0.5.20: #36988 present (retire after forward), #38935 absent: the decode hangs."""

    version = "0.5.20"
    has_ready_endpoint = True

    def retires_aborted_result_after_forward(self) -> bool:
        """`prefill.py _retire_aborted_prefill_result`: `update_finish_state()` turns `to_finish` into
        the terminal abort after the forward; nothing is sent to decode."""
        return True

    def stops_late_chunks_after_abort(self) -> bool:
        """Once the prefill learned of a decode abort the room is failed (`mooncake/conn.py`, bootstrap
        thread's "ABORT" handling): `MooncakeKVManager.add_transfer_request` posts no further chunk and
        `transfer_worker` skips chunks it dequeues for the failed room. Only the write already in flight
        (posted and started before the abort arrived) still lands."""
        return True


class Release0521(Release0520):
    """sglang 0.5.21: #38935 admission door, deferred release on by default, ACK after drain, checksum flag."""

    version = "0.5.21"
    has_kv_checksum_flag = True
    has_kvgate_backport = False

    def admission_door_rejects(self, aborted: bool, holds_resources: bool) -> bool:
        """`disaggregation/utils.py is_unadmitted_reject`: aborted and holding no KV/metadata/retraction
        backup. Re-entering or preempted requests that hold resources are NOT dropped here."""
        return aborted and not holds_resources

    def acks_abort_after_drain(self) -> bool:
        """#40645: `CommonKVSender.clear` calls `_maybe_ack_drained_abort`, ACK once writes drain."""
        return True

    def server_info_extra(self, mode: str) -> dict[str, Any]:
        extra = super().server_info_extra(mode)
        extra["frontend"] = "python"  # from 0.5.21 (sglang-surface.md 1a)
        return extra

    def model_info_extra(self, mode: str) -> dict[str, Any]:
        return {"disaggregation_mode": mode}


class Release0522(Release0521):
    """sglang 0.5.22: the recommended minimum; `internal_states` report the live PD role."""

    version = "0.5.22"

    def internal_state_extra(self, mode: str) -> dict[str, Any]:
        """`Scheduler.get_internal_state` adds the live role and decode CUDA-graph keys from 0.5.22."""
        return {"disaggregation_mode": mode, "decode_cuda_graph_bs": None, "decode_cuda_graph_memory_gb": 0.0}


class Release0523(Release0522):
    """sglang 0.5.23: extra server args (allocation policy, role switch) and `hicache_object_layout`."""

    version = "0.5.23"
    has_decode_allocation_args = True

    def server_info_extra(self, mode: str) -> dict[str, Any]:
        extra = super().server_info_extra(mode)
        extra["hicache_object_layout"] = None
        return extra


class KvgateBackport(SimRelease):
    """kvgate's own backport series on 0.5.19/0.5.20 (issue 6), applied on top of a release object.

    1. admission door: `is_unadmitted_reject` requests are retired at `PrefillBootstrapQueue.add` /
       `DecodePreallocQueue.add` with their original error (what #38935 does; like #38935 it does not
       tell the decode, which waits for the KV until its waiting timeout);
    2. deferred decode KV release on by default (what #41023 does; #40645's ACK fix is NOT part of the
       series, so a deferring decode still waits for the hold timeout after a lost ACK);
    on 0.5.19 also 3. aborted prefill results retired after the forward (what #36988 does);
    optional hardening (`kvgate-backport-hardened`): decode checks, before committing a handoff, that the
    KV coverage prefill claims equals what it reserved (checklist item 3; #38704 never merged).
    The simulator's mismatch message is its own; the backport's real wording lives in backports/.
    """

    def __init__(self, base: SimRelease, hardened: bool) -> None:
        self._base = base
        self.version = base.version
        self.has_ready_endpoint = base.has_ready_endpoint
        self.has_kv_checksum_flag = base.has_kv_checksum_flag
        self.has_decode_allocation_args = base.has_decode_allocation_args
        self.has_kvgate_backport = base.has_kvgate_backport
        self.hardened = hardened

    @property
    def deferred_release_default(self) -> bool:
        return True  # the series turns it on, as #41023 does in 0.5.21

    def admission_door_rejects(self, aborted: bool, holds_resources: bool) -> bool:
        return aborted and not holds_resources

    def retires_aborted_result_after_forward(self) -> bool:
        return True

    def stops_late_chunks_after_abort(self) -> bool:
        return True

    def acks_abort_after_drain(self) -> bool:
        return self._base.acks_abort_after_drain()

    def validates_transfer_coverage(self) -> bool:
        return self.hardened

    def server_info_extra(self, mode: str) -> dict[str, Any]:
        return self._base.server_info_extra(mode)

    def internal_state_extra(self, mode: str) -> dict[str, Any]:
        return self._base.internal_state_extra(mode)

    def model_info_extra(self, mode: str) -> dict[str, Any]:
        return self._base.model_info_extra(mode)


FIXED_BY = ("kvgate-backport", "kvgate-backport-hardened")


#: One class per release of `kvgate.upstream.releases.RELEASES`, the one list of releases kvgate knows
#: (tests/sim/test_units.py checks that every release there has one).
_BY_VERSION: dict[str, type[SimRelease]] = {
    cls.version: cls for cls in (Release0519, Release0520, Release0521, Release0522, Release0523)
}


def get_release(version: str, fixed_by: str | None = None) -> SimRelease:
    """The behaviour object of an emulated release (optionally with kvgate's backport); ValueError if unknown."""
    try:
        release = _BY_VERSION[version]()
    except KeyError:
        raise ValueError(f"unsupported --emulate {version!r}; choose one of {', '.join(RELEASES)}") from None
    if fixed_by is None:
        return release
    if fixed_by not in FIXED_BY:
        raise ValueError(f"unsupported --fixed-by {fixed_by!r}; choose one of {', '.join(FIXED_BY)}")
    if not release.has_kvgate_backport:
        with_series = " and ".join(v for v in RELEASES if v in _BY_VERSION and _BY_VERSION[v].has_kvgate_backport)
        raise ValueError(f"--fixed-by kvgate-backport applies to {with_series} only")
    return KvgateBackport(release, hardened=fixed_by.endswith("hardened"))

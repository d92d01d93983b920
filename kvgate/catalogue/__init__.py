"""The fix catalogue: which of the incident's upstream fixes (and kvgate's backports) the code carries.

Data lives in `fixes.yaml` (one entry per upstream record, plus our backports); `model` loads it,
`version`, `git` and `source` are the detectors (methods 1-3), `combine` makes one answer per fix
(present / absent / unknown, evidence kept, source trusted over version), `assess` turns a target into
an `Assessment` and findings.

Correctness fixes (missing one fails `kvgate fixes` and the defenses gate for a PD deployment):
  #36988  retire aborted prefill results (closes the one-token short handoff of #30233)        0.5.20
  #38935  retire intake-rejected requests at the PD admission doors (incident gate 2)          0.5.21
  #35049  deferred decode KV release machinery (page lifetime)                           <= 0.5.19
  #41023  deferred decode KV release on by default, capability-gated                           0.5.21
  #40645  keep abort ACKs until in-flight writes drain                                         0.5.21
  #41402  fan drain ACKs out to every decode peer [3P number]                                  0.5.21
  #41404  force drain-ack registration on failures decode did not initiate [3P]                0.5.21
  ack-generations  generation-tagged ABORT_ACKs per endpoint, poisoned rooms (origin PR
          unconfirmed; matches #37077)                                                         0.5.22
  mori-deferred-release  Mori supports deferred release, counted only when the backend is mori  0.5.22
  #17430  decode checks bootstrap_room in the metadata slot (a collision aborts, not mixes)  <= 0.5.19
  zmq-send-lock  per-endpoint ZMQ send lock (interleaved frames corrupt aux data; origin PR
          unconfirmed)                                                                       <= 0.5.19
  #27372  decode's ABORT stops an in-flight Mooncake prefill, counted only on mooncake       <= 0.5.19
  #30352  NIXL prefill handles ABORT, Failed stays sticky, counted only on nixl              <= 0.5.19

The last four are in every verified release: they fail only a fork or vendor build whose code lacks
them (the code scan sees it; a version string cannot). Not gated from the same survey: #27374 (a freed
slot's room zeroed: without it #17430 aborts falsely, availability), #39357 (rebootstrap to the served
prefill rank: a hang), #33362 + #37506 (unified-pool page translation: only hybrid SWA / Mamba pools,
which server_info does not name, so requiring it would block deployments that never run that code).
Known open problems (`kind: open-problem`, #36707, #40731, #40125, #29978) carry the code the problem
lives in as signatures: present means "still open here"; they are listed, never gated, never passed.

Why this set. These are the fixes for the three failure classes that let a response read another
request's KV: admission (gate 2), short handoff / abort cleanup, and page lifetime (gate 4). Detection
aids (#39500 checksum, its 0.5.23 safety change, the KV canary) are opt-in and judged by the defenses
gate, not required here. Never-merged proposals (#30325, #38704) are in no release, so requiring them
would fail every release; they are reported, and kvgate's verify-handoff-coverage patch stands in for
#38704. #36612 and #37454 are latency / waste fixes. #38935's author calls it waste-and-latency after
#36988; kvgate still requires it because the incident's acceptance gate 2 demands retirement before
bootstrap, metadata and sender/receiver creation, which #36988 alone does not give.

0.5.21 carries every named fix, yet the incident recommends 0.5.22 as the minimum. Reading the wheels,
the page-lifetime code that changed between them is the ABORT_ACK handling: 0.5.21 counts an ACK by room
only (`note_abort_ack(room, rank)`), so an ACK left over from an earlier hold of the same room can count
toward releasing pages a newer transfer may still write; 0.5.22 ties each ACK to the generation holding
the room and poisons rooms whose drain cannot be proven. kvgate counts that change as a correctness fix
(entry `ack-generations`), so 0.5.21 fails and 0.5.22 passes. That 0.5.21 is exposed without it is our
reading of the code, not an upstream statement; the entry says so.

Backports are recognised by their code (kvgate/catalogue/backports.py): every file a kvgate patch
changes must carry that file's code signatures from the series manifest (backports/v<release>/
manifest.yaml); a byte-identical file is reported as such. Verified code stands in for the upstream fix
the patch backports (kvgate-admission-door -> #38935, kvgate-deferred-release-default -> #41023,
kvgate-retire-aborted-results -> #36988, kvgate-verify-handoff-coverage -> #38704 / checklist item 3),
so a patched 0.5.20 reads as "0.5.20 + kvgate backports". The marker line `# kvgate-backport: <id>`
is a label: without the code it is a tampered backport, a failure of its own.

The code is read by one scan (kvgate/catalogue/scanprog.py, standard library only) run in-process
(`--site-packages`), in a git commit (`--repo`) or through `--python COMMAND` on the machine that runs
the server; `assess_code` turns any of them into the same assessment, and `to_findings` / `describe`
render it the same way in `kvgate fixes` and in `check`'s defenses gate. A version string alone is
"version string only, code not read"; a version newer than the newest verified release is weak
evidence (release order) and never passes a correctness fix.

Method 4 (behaviour) is a hook: a probe that executes the installed admission code returns
`Detection(fix_id="pr-38935", method="behaviour", ...)`, passed to `assess()` with the others.
"""

from __future__ import annotations

from kvgate.catalogue.assess import (
    Assessment,
    assess,
    assess_checkout,
    assess_code,
    assess_installed,
    assess_version,
    describe,
    to_findings,
)
from kvgate.catalogue.combine import FixStatus, combine
from kvgate.catalogue.model import Catalogue, Detection, Fix, Presence, Signature, load_catalogue
from kvgate.catalogue.version import ReleaseString, parse_release

__all__ = [
    "Assessment",
    "Catalogue",
    "Detection",
    "Fix",
    "FixStatus",
    "Presence",
    "ReleaseString",
    "Signature",
    "assess",
    "assess_checkout",
    "assess_code",
    "assess_installed",
    "assess_version",
    "combine",
    "describe",
    "load_catalogue",
    "parse_release",
    "to_findings",
]

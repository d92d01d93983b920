"""The one command line that turns a `check`'s lack of evidence (exit 3) into evidence for this deployment.

A version string is not evidence and a run without the router sends no probe: where that is what left
the run inconclusive, the report's first screen shows the same command with what was missing added,
built from the run's own flags (formats/digest.py `NEXT_STEP`).
"""

from __future__ import annotations

import re
import shlex
from urllib.parse import urlparse

from kvgate.exitcodes import ExitStatus
from kvgate.formats.digest import NEXT_STEP
from kvgate.results.findings import Outcome, Report

# server_info's host of a pod behind a headless Service: POD.SERVICE.NAMESPACE.svc[.cluster.local]
_K8S_HOST = re.compile(r"^(?P<pod>[a-z0-9-]+)\.[a-z0-9-]+\.(?P<ns>[a-z0-9-]+)\.svc(\.|$)")


def pod_template(prefill: tuple[str, ...], decode: tuple[str, ...]) -> str:
    """A per-node `--python` template for these worker URLs: the pod and namespace read from Kubernetes
    Service names where every node has one (`glm-{role}-{index}`), else placeholders to fill in."""
    pods: list[tuple[str, int, str, str]] = []
    for role, urls in (("prefill", prefill), ("decode", decode)):
        for i, url in enumerate(urls):
            m = _K8S_HOST.match(urlparse(url).hostname or "")
            if m is None:
                return "kubectl exec -i -n NAMESPACE {role}-{index} -c sglang -- python3"
            pods.append((role, i, m["pod"], m["ns"]))
    role, i, pod, ns = pods[0]
    template = pod.replace(role, "{role}", 1)
    template = template[: -len(str(i))] + "{index}" if template.endswith(f"-{i}") else template
    same_ns = all(p[3] == ns for p in pods)
    if same_ns and all(template.format(role=r, index=j) == p for r, j, p, _ in pods):
        return f"kubectl exec -i -n {ns} {template} -c sglang -- python3"
    return "kubectl exec -i -n NAMESPACE {role}-{index} -c sglang -- python3"


def next_step(report: Report, argv: list[str], prefill: tuple[str, ...], decode: tuple[str, ...]) -> str | None:
    """`check` with the flag that makes the missing evidence, or None when that is not what blocked."""
    if report.exit_status is not ExitStatus.INCONCLUSIVE:
        return None
    doubts = [f for f in report.findings if f.outcome is Outcome.INCONCLUSIVE and f.counts_toward_exit]
    add: list[str] = []
    given = {a.split("=", 1)[0] for a in argv}
    code_flags = {"--python", "--site-packages", "--trust-version"}
    if any(f.test_id == "defenses.release" and "code not read" in f.summary for f in doubts) and not (
        given & code_flags
    ):
        add += ["--python", pod_template(prefill, decode)]
    if any(f.gate == "probes" for f in doubts) and "--router-url" not in given:
        add += ["--router-url", "http://ROUTER:PORT"]
    if not add:
        return None
    return NEXT_STEP + shlex.join(["kvgate", "check", *argv, *add])

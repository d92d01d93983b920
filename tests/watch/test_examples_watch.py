"""examples/kubernetes/watch/: every object parses, names only flags (kvgate's own parser) and metrics
(kvgate.watch.metrics.METRIC_NAMES) that exist, and points Prometheus, Argo and Flagger at the
Service's real port and paths."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from kvgate.watch.metrics import METRIC_NAMES
from tests.test_examples import K8S_VERSION, parse

ROOT = Path(__file__).resolve().parents[2]
WATCH = ROOT / "examples" / "kubernetes" / "watch"
SUFFIXES = ("_total", "_bucket", "_count", "_sum")


def _objects() -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    for path in sorted(WATCH.glob("*.yaml")):
        for d in yaml.safe_load_all(path.read_text()):
            if d is not None:
                assert d.get("apiVersion") and d.get("metadata", {}).get("name"), path
                out[d["kind"]] = d
    return out


def metric_exists(name: str) -> bool:
    return (
        name in METRIC_NAMES
        or any(name.endswith(s) and name[: -len(s)] in METRIC_NAMES for s in SUFFIXES)
        or (name.endswith("_total") and name in {n + "_total" for n in METRIC_NAMES})
    )


def test_every_kind_is_there() -> None:
    assert set(_objects()) == {
        "Deployment",
        "Service",
        "ServiceMonitor",
        "PrometheusRule",
        "AnalysisTemplate",
        "Canary",
    }


def test_the_deployment_runs_watch_with_flags_that_exist() -> None:
    objs = _objects()
    (c,) = objs["Deployment"]["spec"]["template"]["spec"]["containers"]
    assert c["command"] == ["kvgate"] and c["args"][0] == "watch"
    ctx = parse(c["args"])  # kvgate's own parser: an unknown flag or a bad value raises
    assert ctx is not None and ctx.params["listen"] == "0.0.0.0:9464" and ctx.params["token_env"] == "SGLANG_API_KEY"
    assert "secretKeyRef" in {e["name"]: e for e in c["env"]}["SGLANG_API_KEY"]["valueFrom"]
    port = {p["name"]: p["containerPort"] for p in c["ports"]}["metrics"]
    assert port == 9464 and c["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "metrics"}
    svc = objs["Service"]["spec"]
    assert svc["selector"].items() <= objs["Deployment"]["spec"]["template"]["metadata"]["labels"].items()
    assert {"name": "metrics", "port": 9464, "targetPort": "metrics"} in svc["ports"]


def test_prometheus_objects_name_only_metrics_that_exist() -> None:
    objs = _objects()
    sm = objs["ServiceMonitor"]["spec"]
    assert sm["selector"]["matchLabels"].items() <= objs["Service"]["metadata"]["labels"].items()
    assert sm["endpoints"][0]["port"] == "metrics" and sm["endpoints"][0]["path"] == "/metrics"
    rules = [r for g in objs["PrometheusRule"]["spec"]["groups"] for r in g["rules"]]
    alerts = {r["alert"]: r["expr"] for r in rules}
    names = {n for e in alerts.values() for n in re.findall(r"\bkvgate_\w+", e)}
    assert names and all(metric_exists(n) for n in names), sorted(n for n in names if not metric_exists(n))
    assert alerts["KvgateVerdictNotPassed"].startswith("kvgate_verdict != 0")
    assert (
        "kvgate_worker_kv_pool_context_ratio" in alerts["KvgatePoolUnderHeadroom"]
        and "1.25" in alerts["KvgatePoolUnderHeadroom"]
    )
    assert "kvgate_latency_too_good == 1" in alerts["KvgateLatencyTooGood"]
    assert not metric_exists("kvgate_no_such_metric")  # the check can fail


def test_argo_and_flagger_read_the_verdict_endpoint() -> None:
    objs = _objects()
    (m,) = objs["AnalysisTemplate"]["spec"]["metrics"]
    web = m["provider"]["web"]
    assert web["url"] == "http://kvgate-watch.llm-serving.svc:9464/verdict" and web["jsonPath"] == "{$.passed}"
    assert m["successCondition"] == "result == true" and m["failureLimit"] == 0
    (hook,) = objs["Canary"]["spec"]["analysis"]["webhooks"]
    assert hook["url"] == web["url"] and hook["type"] == "confirm-promotion"


def test_deployment_and_service_validate_against_the_kubernetes_schema() -> None:
    kv = pytest.importorskip("kubernetes_validate", reason="kubernetes-validate (the test extra) ships the schema")
    objs = _objects()
    for kind in ("Deployment", "Service"):
        kv.validate(objs[kind], K8S_VERSION, strict=True)


def test_readme_watch_section_names_every_metric() -> None:
    text = (ROOT / "docs" / "usage.md").read_text().split("## Watch", 1)[1].split("\n## ", 1)[0]
    named = set(re.findall(r"`(kvgate_\w+)", text))
    assert set(METRIC_NAMES) <= named | {n.removesuffix("_total") for n in named}, set(METRIC_NAMES) - named
    assert all(metric_exists(n) for n in named), sorted(n for n in named if not metric_exists(n))

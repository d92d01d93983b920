"""A code scan vouches for a node only if it is that node's code (issue 20, confirmed case 2).

Workers are real loopback HTTP servers reporting a version; the code is the REAL sglang wheel source,
reached through commands like `kubectl exec -i POD -- python3`: a clean environment (`env -i`) and a
system python3 with no kvgate. Per-node templates point each node at its own folder of symlinks, as a
`kubectl exec -i {role}-{index}` points each node at its own pod.
"""

from __future__ import annotations

import json
import shlex
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from kvgate.cli import app
from kvgate.errors import UsageError
from kvgate.exitcodes import ExitStatus
from kvgate.gates.defenses import CodeSource, vouch
from kvgate.reading.node import NodeSpec
from tests.assets import sglang_payloads as P
from tests.catalogue.helpers import wheel
from tests.conftest import PayloadServer, Route

pytestmark = pytest.mark.wheels
runner = CliRunner()
PY3 = shutil.which("python3", path="/usr/bin:/bin")


def remote(root: Path | str) -> str:
    """One interpreter whose only sglang is under `root` (what `kubectl exec -i POD -- python3` reaches)."""
    return f"env -i PATH=/usr/bin:/bin PYTHONPATH={shlex.quote(str(root))} python3"


def worker(make: Callable[..., PayloadServer], version: str, mode: str) -> PayloadServer:
    return make(
        {
            "/server_info": Route(P.server_info(version, mode=mode, context=1_048_576, pool=2_040_000)),
            "/v1/models": Route(P.v1_models(1_048_576)),
            "/model_info": Route(P.model_info(version, mode)),
        }
    )


def check(*args: str) -> tuple[int, dict[str, Any]]:
    res = runner.invoke(app, ["check", "--quiet", *args, "--format", "json"])
    return res.exit_code, json.loads(res.stdout)


def releases(doc: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The defenses.release finding of each node, by role[index]."""
    return {f["node"].split()[0]: f for f in doc["findings"] if f["gate"] == "defenses" and f["check"] == "release"}


def rows(finding: dict[str, Any]) -> dict[str, Any]:
    return {e["field"]: e["value"] for e in finding["evidence"]}


@pytest.fixture(scope="module")
def pods(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One folder per pod, named as a StatefulSet names its pods: prefill-0 runs 0.5.22, decode-0 0.5.19."""
    root = tmp_path_factory.mktemp("pods")
    (root / "prefill-0").symlink_to(wheel("0.5.22"))
    (root / "decode-0").symlink_to(wheel("0.5.19"))
    return root


def test_confirmed_case_2_one_pod_scan_no_longer_vouches_for_a_0_5_19_decode(
    payload_server: Callable[..., PayloadServer],
) -> None:
    """Rebuilt from the issue: `--python CMD` reaching one pod (0.5.22 code), a decode reporting 0.5.19.
    It used to pass defenses.release on the decode (exit 0 with the rest clean); now it fails, as
    the same run without --python does."""
    p = worker(payload_server, "0.5.22", "prefill")
    d = worker(payload_server, "0.5.19", "decode")
    base = ["--prefill-url", p.url, "--decode-url", d.url, "--no-strict", "--deferred-release"]
    code, doc = check(*base, "--python", remote(wheel("0.5.22")))
    assert code == ExitStatus.GATE_FAILED
    rel = releases(doc)
    assert rel["decode[0]"]["outcome"] == "failed"
    assert "declares sglang 0.5.22, but this node reports 0.5.19" in rel["decode[0]"]["summary"]
    assert rows(rel["decode[0]"])["pr-38935"].startswith("absent:")  # what its version string shows
    # The prefill reports what the scanned package declares: one scan for both, counted for it and named so.
    assert rel["prefill[0]"]["outcome"] == "passed"
    assert "one scan for 2 nodes" in rows(rel["prefill[0]"])["code_source"]
    without, _ = check(*base)
    assert without == ExitStatus.GATE_FAILED


def test_one_scan_for_a_fleet_that_reports_its_version_still_works(
    payload_server: Callable[..., PayloadServer],
) -> None:
    """The honest single --python: every node reports the version the scanned package declares."""
    p = worker(payload_server, "0.5.22", "prefill")
    d = worker(payload_server, "0.5.22", "decode")
    code, doc = check(
        "--prefill-url", p.url, "--decode-url", d.url, "--python", remote(wheel("0.5.22")), "--deferred-release"
    )
    rel = releases(doc)
    assert {f["outcome"] for f in rel.values()} == {"passed"}, [f["summary"] for f in rel.values()]
    assert all("decided by source" in f["summary"] for f in rel.values())


def test_per_node_templates_read_each_nodes_own_code(payload_server: Callable[..., PayloadServer], pods: Path) -> None:
    p = worker(payload_server, "0.5.22", "prefill")
    d = worker(payload_server, "0.5.19", "decode")
    template = remote(f"{pods}/{{role}}-{{index}}")
    code, doc = check("--prefill-url", p.url, "--decode-url", d.url, "--python", template, "--no-strict")
    assert code == ExitStatus.GATE_FAILED
    rel = releases(doc)
    # Each node judged by its own code (decided by source), not by a label.
    assert rel["prefill[0]"]["outcome"] == "passed" and "decided by source" in rel["prefill[0]"]["summary"]
    assert rel["decode[0]"]["outcome"] == "failed" and "code read (" in rel["decode[0]"]["summary"]
    assert "by source" in rows(rel["decode[0]"])["pr-38935"]
    assert "code_source" not in rows(rel["prefill[0]"])  # its own scan, not a shared one
    assert f"{pods}/decode-0" in rows(rel["decode[0]"])["code"]


@pytest.mark.parametrize("strict", [[], ["--no-strict"]], ids=["strict", "no-strict"])
def test_a_nodes_own_scan_of_another_release_says_so_plainly(
    payload_server: Callable[..., PayloadServer], tmp_path: Path, strict: list[str]
) -> None:
    """Issue 29: a per-node template reads 0.5.20 code on a decode that reports 0.5.22. The operator
    said which code is that node's: the finding says the node reports one release and runs another,
    names what that code lacks, tells how to check the scan reached the server, and blocks."""
    (tmp_path / "prefill-0").symlink_to(wheel("0.5.22"))
    (tmp_path / "decode-0").symlink_to(wheel("0.5.20"))
    p = worker(payload_server, "0.5.22", "prefill")
    d = worker(payload_server, "0.5.22", "decode")
    template = remote(f"{tmp_path}/{{role}}-{{index}}")
    code, doc = check(
        "--prefill-url", p.url, "--decode-url", d.url, "--python", template, "--deferred-release", *strict
    )
    assert code == ExitStatus.GATE_FAILED
    f = releases(doc)["decode[0]"]
    assert f["outcome"] == "failed" and f["blocking"]
    assert "this node reports sglang 0.5.22 but runs 0.5.20" in f["summary"]
    assert "that code lacks" in f["summary"] and "#38935" in f["summary"]
    assert "sys.executable" in f["summary"] and "sys.executable" in f["remedy"]
    assert "which code this node runs is unknown" not in f["summary"]
    assert rows(f)["pr-38935"].startswith("absent")  # what the scanned code shows, by source
    assert releases(doc)["prefill[0]"]["outcome"] == "passed"


def test_a_nodes_own_scan_of_another_release_with_every_fix_still_blocks(
    payload_server: Callable[..., PayloadServer], tmp_path: Path
) -> None:
    """The scanned code (0.5.22) carries every correctness fix, but the node reports 0.5.21: which
    label is wrong is unknown, so it is inconclusive and blocks with --no-strict too."""
    (tmp_path / "decode-0").symlink_to(wheel("0.5.22"))
    (tmp_path / "prefill-0").symlink_to(wheel("0.5.22"))
    p = worker(payload_server, "0.5.22", "prefill")
    d = worker(payload_server, "0.5.21", "decode")
    template = remote(f"{tmp_path}/{{role}}-{{index}}")
    code, doc = check("--prefill-url", p.url, "--decode-url", d.url, "--python", template, "--no-strict")
    assert code == ExitStatus.INCONCLUSIVE  # never a pass, --no-strict included
    f = releases(doc)["decode[0]"]
    assert f["outcome"] == "inconclusive" and f["blocking"]
    assert "this node reports sglang 0.5.21 but runs 0.5.22" in f["summary"]
    assert "carries every correctness fix" in f["summary"] and "sys.executable" in f["summary"]


def test_port_placeholder_and_profile_url_entries(payload_server: Callable[..., PayloadServer], tmp_path: Path) -> None:
    p = worker(payload_server, "0.5.22", "prefill")
    d = worker(payload_server, "0.5.20", "decode")
    by_port = tmp_path / "by-port"
    by_port.mkdir()
    (by_port / p.url.rsplit(":", 1)[1]).symlink_to(wheel("0.5.22"))
    prof = tmp_path / "code.yaml"
    prof.write_text(
        json.dumps(
            {
                "code": {
                    "prefill": {"python": remote(f"{by_port}/{{port}}")},
                    d.url: {"site_packages": str(wheel("0.5.20"))},
                }
            }
        )
    )
    code, doc = check("--prefill-url", p.url, "--decode-url", d.url, "--profile", str(prof), "--no-strict")
    rel = releases(doc)
    assert rel["prefill[0]"]["outcome"] == "passed" and "decided by source" in rel["prefill[0]"]["summary"]
    assert rel["decode[0]"]["outcome"] == "failed" and "code read (" in rel["decode[0]"]["summary"]
    assert code == ExitStatus.GATE_FAILED


@pytest.mark.parametrize("where", ["flag", "profile"])
def test_an_unknown_placeholder_is_a_usage_error(
    payload_server: Callable[..., PayloadServer], tmp_path: Path, where: str
) -> None:
    p = worker(payload_server, "0.5.22", "prefill")
    command = "kubectl exec -i {pod} -- python3"
    if where == "flag":
        args = ["--python", command]
    else:
        prof = tmp_path / "p.yaml"
        prof.write_text(json.dumps({"code": {"prefill": {"python": command}}}))
        args = ["--profile", str(prof)]
    res = runner.invoke(app, ["check", "--quiet", "--prefill-url", p.url, *args])
    assert res.exit_code == ExitStatus.USAGE_ERROR
    assert "unknown placeholder {pod}" in res.stderr and "{role}" in res.stderr


@pytest.mark.parametrize(
    "url",
    [
        "http://127.0.0.1:1/$(touch /tmp/kvgate-owned)",
        "http://127.0.0.1:1/a;rm -rf x",
        "http://127.0.0.1:1/'quote",
        "http://127.0.0.1:1/`id`",
        "http://127.0.0.1:1/a b",
    ],
)
def test_a_hostile_node_url_never_reaches_the_command(url: str) -> None:
    src = CodeSource(python="ssh box python3 --url {url}")
    with pytest.raises(UsageError, match="not safe in a command"):
        src.for_node(NodeSpec("prefill", url, 0))


@settings(max_examples=200, deadline=None, database=None)
@example(path="\n", index=0)  # found by hypothesis: `^...$` let a trailing newline through
@given(
    path=st.text(alphabet=st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=30),
    index=st.integers(0, 10_000),
)
def test_a_rendered_template_keeps_its_shape(path: str, index: int) -> None:
    """Whatever a router lists, a template renders to the same number of arguments or is refused."""
    template = "kubectl exec -i {role}-{index} -- sh -c 'exec python3' {url}"
    spec = NodeSpec("prefill", f"http://10.0.0.7:30000/{path}", index)
    try:
        rendered = CodeSource(python=template).for_node(spec).python
    except UsageError:
        return
    assert rendered is not None
    argv = shlex.split(rendered)
    assert len(argv) == len(shlex.split(template)) and argv[-1] == spec.url and argv[3] == f"prefill-{index}"


@pytest.mark.parametrize(
    "reported, scanned, shared, counts",
    [
        ("0.5.22", "0.5.22", 1, True),
        ("0.5.22", "0.5.22", 4, True),
        ("v0.5.22", "0.5.22", 4, True),  # PEP 440: the same version
        ("0.5.19", "0.5.22", 1, False),
        ("0.5.19", "0.5.22", 4, False),
        (None, "0.5.22", 1, True),  # its own interpreter: the scan is its code
        (None, "0.5.22", 4, False),  # one scan for a fleet cannot be matched to this node
        ("0.5.22", None, 1, True),
        ("0.5.22", None, 4, False),
        ("garbage", "garbage", 4, True),
        ("garbage", "0.5.22", 1, False),
    ],
)
def test_the_vouching_rule(reported: str | None, scanned: str | None, shared: int, counts: bool) -> None:
    why = vouch(reported, scanned, "--python 'x'", shared)
    assert (why is None) is counts, why
    if why is not None and reported and scanned:
        assert reported in why and scanned in why

"""One answer for one version string (issue 20, confirmed case 3): `check` and `fixes` agree on every
version string, `--no-strict` included; an unknown correctness state blocks in both.

A real loopback worker reports each string in its /server_info; `fixes --release` judges the same
string. One function decides both (kvgate.catalogue.assess.correctness_verdict).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from kvgate.cli import app
from kvgate.exitcodes import ExitStatus
from tests.assets import sglang_payloads as P
from tests.conftest import PayloadServer, Route

runner = CliRunner()
OUTCOME = {ExitStatus.PASSED: "passed", ExitStatus.GATE_FAILED: "failed", ExitStatus.INCONCLUSIVE: "inconclusive"}


@pytest.fixture(scope="module")
def server() -> Iterator[PayloadServer]:
    srv = PayloadServer().start()
    yield srv
    srv.stop()


def serve(srv: PayloadServer, version: str | None) -> None:
    info = P.server_info("0.5.22", mode="prefill", context=1_048_576, pool=2_040_000)
    if version is None:
        info.pop("version")
    else:
        info["version"] = version
    srv.routes.update(
        {
            "/server_info": Route(info),
            "/v1/models": Route(P.v1_models(1_048_576)),
            "/model_info": Route(P.model_info("0.5.22", "prefill")),
        }
    )


def check(srv: PayloadServer, *args: str) -> tuple[int, dict[str, Any]]:
    res = runner.invoke(
        app, ["check", "--quiet", "--prefill-url", srv.url, "--deferred-release", *args, "--format", "json"]
    )
    return res.exit_code, json.loads(res.stdout)


def fixes(*args: str) -> int:
    return runner.invoke(app, ["fixes", *args]).exit_code


def release(doc: dict[str, Any]) -> dict[str, Any]:
    [f] = [f for f in doc["findings"] if f["gate"] == "defenses" and f["check"] == "release"]
    return f


def test_confirmed_case_3_no_strict_no_longer_passes_an_rc(server: PayloadServer) -> None:
    """Rebuilt from the issue: a worker reporting 0.5.22rc1 passed `check --no-strict` while
    `fixes --release 0.5.22rc1 --no-strict` exits 3. Both exit 3 now, and say why."""
    serve(server, "0.5.22rc1")
    code, doc = check(server, "--no-strict")
    assert code == ExitStatus.INCONCLUSIVE
    f = release(doc)
    assert f["outcome"] == "inconclusive" and f["blocking"] and "unknown: ack-generations" in f["summary"]
    assert "0.5.22rc1" in f["summary"]
    assert "defenses.release" not in " ".join(doc["notes"])  # not listed among what --no-strict let through
    assert fixes("--release", "0.5.22rc1", "--no-strict") == ExitStatus.INCONCLUSIVE
    assert fixes("--url", server.url, "--no-strict") == ExitStatus.INCONCLUSIVE


def test_no_strict_still_lets_a_version_string_that_shows_every_fix_through(server: PayloadServer) -> None:
    """The opt-out keeps its meaning: 'code not read' is doubt --no-strict accepts (and reports)."""
    serve(server, "0.5.22")
    code, doc = check(server, "--no-strict")
    assert code == ExitStatus.PASSED
    assert not release(doc)["blocking"] and any("defenses.release" in n for n in doc["notes"])
    assert fixes("--release", "0.5.22", "--no-strict") == ExitStatus.PASSED


_RELEASES = st.builds(
    lambda v, minor, patch, pre, post, dev, local: f"{v}0.{minor}.{patch}{pre}{post}{dev}{local}",
    st.sampled_from(["", "v"]),
    st.integers(4, 7),
    st.integers(0, 30),
    st.sampled_from(["", "a1", "b2", "rc1", "rc0"]),
    st.sampled_from(["", ".post1", "-1"]),
    st.sampled_from(["", ".dev3", ".dev0"]),
    st.sampled_from(["", "+g8f3d694", "+fork.1", "+cu124"]),
)
VERSIONS = st.one_of(
    st.sampled_from(["0.5.19", "0.5.20", "0.5.21", "0.5.22", "0.5.23", "0.5.24", "0.6.0", "1!0.5.22", ""]),
    _RELEASES,
    st.text(alphabet=st.characters(codec="utf-8", exclude_categories=("Cs", "Cc")), max_size=12),
)


@settings(max_examples=40, deadline=None, database=None)
@example(version="0.5.22rc1")
@example(version="0.5.24")
@example(version="0.5.21.post1")
@example(version="garbage")
@example(version="")
@given(version=VERSIONS)
def test_check_and_fixes_agree_on_every_version_string(server: PayloadServer, version: str) -> None:
    serve(server, version)
    by_version = fixes(f"--version={version}", "--no-strict")
    by_url = fixes("--url", server.url, "--no-strict")
    code, doc = check(server, "--no-strict")
    f = release(doc)
    if by_version == ExitStatus.USAGE_ERROR:  # not PEP 440: the user's typo in fixes, the server's in check
        assert code == by_url == ExitStatus.INCONCLUSIVE and f["blocking"], f["summary"]
        return
    assert code == by_version == by_url, (version, f["summary"])
    assert f["blocking"] == (by_version == ExitStatus.INCONCLUSIVE)
    # At the defaults, with the version string accepted (--trust-version), the release check's own verdict
    # is what `fixes` says (the other gates may add doubt of their own here).
    default = fixes(f"--version={version}")
    _, doc = check(server, "--trust-version")
    assert release(doc)["outcome"] == OUTCOME[ExitStatus(default)], (version, release(doc)["summary"])


def test_a_worker_without_a_version_blocks_in_both(server: PayloadServer) -> None:
    serve(server, None)
    code, doc = check(server, "--no-strict", "--trust-version")
    assert code == ExitStatus.INCONCLUSIVE and release(doc)["blocking"]
    assert fixes("--url", server.url, "--no-strict") == ExitStatus.INCONCLUSIVE

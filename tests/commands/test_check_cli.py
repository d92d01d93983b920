"""`kvgate check` run in-process against real loopback HTTP servers: one test per exit code and more."""

from __future__ import annotations

import json
import socket
import xml.etree.ElementTree as ET
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from kvgate.cli import app
from kvgate.exitcodes import ExitStatus
from tests.assets import sglang_payloads as P
from tests.conftest import PayloadServer, Route

runner = CliRunner()


def worker(
    make: Callable[..., PayloadServer],
    version: str = "0.5.20",
    mode: str = "prefill",
    context: int = 1_048_576,
    pool: int = 681_280,
    **kw: Any,
) -> PayloadServer:
    return make(
        {
            "/server_info": Route(P.server_info(version, mode=mode, context=context, pool=pool, **kw)),
            "/v1/models": Route(P.v1_models(context)),
            "/model_info": Route(P.model_info(version, mode)),
        }
    )


def run(*args: str, env: dict[str, str] | None = None) -> Any:
    # Metadata tests: without a router the probes are opted out explicitly (else probes.setup is doubt).
    off = [] if {"--router-url", "--probes", "--no-probes"} & set(args) else ["--no-probes"]
    return runner.invoke(app, ["check", "--quiet", *off, *args], env=env)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_incident_pool_fails_and_names_both_numbers(payload_server: Callable[..., PayloadServer]) -> None:
    p = worker(payload_server, mode="prefill")
    d = worker(payload_server, mode="decode", pool=2_040_000)
    res = run("--prefill-url", p.url, "--decode-url", d.url, "--format", "json")
    assert res.exit_code == ExitStatus.GATE_FAILED, res.output
    doc = json.loads(res.stdout)
    assert doc["schema_version"] == 1 and doc["exit_status"] == 1
    bad = [f for f in doc["findings"] if f["outcome"] == "failed" and f["gate"] == "pool-context"]
    assert {f["check"] for f in bad} == {"headroom", "headroom-dp0"}
    assert all(f["node"].startswith("prefill[0]") for f in bad)
    summary = bad[0]["summary"]
    assert "681,280" in summary and "1,048,576" in summary and "over-pool band" in summary
    ev = {e["field"]: e["value"] for e in bad[0]["evidence"]}
    assert ev["over_pool_band"] == "(681,280, 1,048,576]"
    limits = [f for f in doc["findings"] if f["check"] == "admission-limit" and f["node"].startswith("prefill")]
    ev = {e["field"]: e["value"] for e in limits[0]["evidence"]}
    assert ev["max_req_input_len"] == 681_274 and ev["largest_accepted_prompt"] == 681_273
    assert ev["reject_band"] == "[681,274, 1,048,575]"


def test_doubled_pool_passes(payload_server: Callable[..., PayloadServer]) -> None:
    p = worker(payload_server, "0.5.23", mode="prefill", pool=2_040_000)
    d = worker(payload_server, "0.5.23", mode="decode", pool=2_040_000)
    # A payload server runs no sglang code: its version string is all there is to go on.
    res = run("--prefill-url", p.url, "--decode-url", d.url, "--deferred-release", "--trust-version")
    assert res.exit_code == ExitStatus.PASSED, res.output
    # the explicit opt-out of the probes (run() adds --no-probes without a router) is in the verdict line
    assert res.stdout.startswith("kvgate check: PASSED; probes opted out (--no-probes) (exit 0)")
    assert "2,040,000" not in res.stdout  # passed checks are one digest line by default
    res = run("--prefill-url", p.url, "--decode-url", d.url, "--verbose", "--trust-version", "--deferred-release")
    assert "max_total_num_tokens = 2,040,000" in res.stdout and "(exit 0)" in res.stdout


def test_without_a_router_the_probes_are_doubt_unless_opted_out(payload_server: Callable[..., PayloadServer]) -> None:
    """Issue 19: no --router-url and no --no-probes is probes.setup inconclusive (exit 3 under --strict),
    with the remedy; an explicit --no-probes is an info finding, in the verdict line, and passes."""
    p = worker(payload_server, "0.5.23", mode="prefill", pool=2_040_000)
    d = worker(payload_server, "0.5.23", mode="decode", pool=2_040_000)
    common = ["--prefill-url", p.url, "--decode-url", d.url, "--deferred-release", "--trust-version"]
    res = run("--probes", *common, "--format", "json")
    assert res.exit_code == ExitStatus.INCONCLUSIVE, res.output
    setup = [f for f in json.loads(res.stdout)["findings"] if f["id"] == "probes.setup"]
    assert [(f["outcome"], f["remedy"]) for f in setup] == [
        ("inconclusive", "give the router, or opt out with --no-probes")
    ]
    res = run("--no-probes", *common, "--format", "json")
    assert res.exit_code == ExitStatus.PASSED, res.output
    setup = [f for f in json.loads(res.stdout)["findings"] if f["id"] == "probes.setup"]
    assert [f["outcome"] for f in setup] == ["info"] and "--no-probes" in setup[0]["summary"]
    res = run("--no-probes", *common)
    assert res.stdout.splitlines()[0] == "kvgate check: PASSED; probes opted out (--no-probes) (exit 0)"


def test_decode_pool_is_checked_too(payload_server: Callable[..., PayloadServer]) -> None:
    p = worker(payload_server, "0.5.22", mode="prefill", pool=2_040_000)
    d = worker(payload_server, "0.5.22", mode="decode", pool=900_000)
    res = run("--prefill-url", p.url, "--decode-url", d.url, "--format", "json")
    assert res.exit_code == ExitStatus.GATE_FAILED
    bad = [f for f in json.loads(res.stdout)["findings"] if f["outcome"] == "failed"]
    assert bad and all(f["node"].startswith("decode[0]") for f in bad)


def test_every_dp_rank_is_checked(payload_server: Callable[..., PayloadServer]) -> None:
    p = worker(payload_server, "0.5.23", mode="prefill", pool=2_040_000, rank_pools=[2_040_000, 2_040_000, 700_000])
    res = run("--prefill-url", p.url, "--format", "json")
    assert res.exit_code == ExitStatus.GATE_FAILED
    bad = [f["check"] for f in json.loads(res.stdout)["findings"] if f["outcome"] == "failed"]
    assert bad == ["headroom-dp2"]


def test_missing_pool_field_fails_closed(payload_server: Callable[..., PayloadServer]) -> None:
    p = worker(payload_server, mode="prefill", pool=2_040_000, drop=("max_total_num_tokens",))
    res = run("--prefill-url", p.url, "--format", "json")
    assert res.exit_code == ExitStatus.GATE_FAILED
    doc = json.loads(res.stdout)
    field = [f for f in doc["findings"] if f["check"] == "field"]
    assert field and field[0]["outcome"] == "failed" and "max_total_num_tokens" in field[0]["summary"]


def test_role_mismatch_is_a_finding(payload_server: Callable[..., PayloadServer]) -> None:
    d = worker(payload_server, "0.5.22", mode="decode", pool=2_040_000)
    res = run("--prefill-url", d.url, "--format", "json")
    assert res.exit_code == ExitStatus.GATE_FAILED
    role = [f for f in json.loads(res.stdout)["findings"] if f["check"] == "role"][0]
    assert role["outcome"] == "failed" and "'decode'" in role["summary"]


def test_inconclusive_blocks_by_default_and_the_opt_out_is_reported(
    tmp_path: Path, payload_server: Callable[..., PayloadServer]
) -> None:
    p = worker(
        payload_server,
        "0.5.22",
        mode="prefill",
        pool=2_040_000,
        drop=("disaggregation_mode",),
        drop_in_states=("disaggregation_mode",),
    )
    res = run("--prefill-url", p.url)
    assert res.exit_code == ExitStatus.INCONCLUSIVE, res.output
    assert run("--prefill-url", p.url, "--strict").exit_code == ExitStatus.INCONCLUSIVE
    res = run("--prefill-url", p.url, "--no-strict", "--format", "json")
    assert res.exit_code == ExitStatus.PASSED, res.output
    doc = json.loads(res.stdout)
    assert doc["strict"] is False and doc["strict_source"] == "--no-strict"
    note = [n for n in doc["notes"] if n.startswith("strictness opted out (--no-strict)")]
    assert note and "pool-context.role" in note[0]
    # The profile's `strict: false` opts out too, and the report names it; the flag wins over it.
    prof = tmp_path / "lax.yaml"
    prof.write_text("strict: false\n")
    res = run("--prefill-url", p.url, "--profile", str(prof))
    assert res.exit_code == ExitStatus.PASSED and "opted out (profile strict: false)" in res.stdout
    assert run("--prefill-url", p.url, "--profile", str(prof), "--strict").exit_code == ExitStatus.INCONCLUSIVE


def test_connection_refused_exits_4() -> None:
    url = f"http://127.0.0.1:{free_port()}"
    res = run("--prefill-url", url, "--format", "json")
    assert res.exit_code == ExitStatus.TRANSPORT_ERROR
    doc = json.loads(res.stdout)
    assert doc["findings"][0]["outcome"] == "error" and url in doc["findings"][0]["summary"]


def test_hanging_server_is_bounded_and_exits_4(payload_server: Callable[..., PayloadServer]) -> None:
    srv = payload_server({"/server_info": Route(P.server_info(), delay_s=5.0)})
    res = run("--prefill-url", srv.url, "--timeout", "0.5")
    assert res.exit_code == ExitStatus.TRANSPORT_ERROR
    assert "timeout" in res.stdout


@pytest.mark.parametrize("route", [Route({"detail": "boom"}, status=503), Route(raw=b"{not json")])
def test_5xx_and_bad_json_exit_4(payload_server: Callable[..., PayloadServer], route: Route) -> None:
    srv = payload_server({"/server_info": route})
    res = run("--prefill-url", srv.url)
    assert res.exit_code == ExitStatus.TRANSPORT_ERROR, res.output


def test_get_server_info_fallback(payload_server: Callable[..., PayloadServer]) -> None:
    srv = payload_server(
        {"/get_server_info": Route(P.server_info("0.5.22", pool=2_040_000)), "/v1/models": Route(P.v1_models())}
    )
    res = run("--prefill-url", srv.url, "--format", "json", "--no-strict")
    assert res.exit_code == ExitStatus.PASSED, res.output
    assert json.loads(res.stdout)["target"]["nodes"][0]["max_total_num_tokens"] == 2_040_000


def test_bad_profile_exits_2_naming_file_and_key(tmp_path: Path, payload_server: Callable[..., PayloadServer]) -> None:
    prof = tmp_path / "bad.yaml"
    prof.write_text("headroom: lots\n")
    p = worker(payload_server, pool=2_040_000)
    out = tmp_path / "r.xml"
    res = run("--prefill-url", p.url, "--profile", str(prof), "--format", "junit", "--output", str(out))
    assert res.exit_code == ExitStatus.USAGE_ERROR
    assert str(prof) in res.stderr and "'headroom'" in res.stderr and "expected a number" in res.stderr
    root = ET.parse(out).getroot()
    assert root.tag == "testsuites" and root.get("errors") == "1"


def test_unknown_profile_key_exits_2(tmp_path: Path) -> None:
    prof = tmp_path / "p.yaml"
    prof.write_text("contxt_length: 5\n")
    res = run("--prefill-url", "http://127.0.0.1:1", "--profile", str(prof))
    assert res.exit_code == ExitStatus.USAGE_ERROR and "contxt_length" in res.stderr


def test_bundled_incident_profile_requires_the_advertised_context(payload_server: Callable[..., PayloadServer]) -> None:
    # Engine context 131,072 with a big enough pool for it, but the profile advertises 1M.
    p = worker(payload_server, mode="prefill", context=131_072, pool=200_000)
    res = run("--prefill-url", p.url, "--profile", "glm-5.3-1m", "--format", "json")
    assert res.exit_code == ExitStatus.GATE_FAILED
    checks = {f["check"]: f["outcome"] for f in json.loads(res.stdout)["findings"]}
    assert checks["context-agreement"] == "failed" and checks["headroom"] == "failed"


def test_flags_override_profile(payload_server: Callable[..., PayloadServer]) -> None:
    p = worker(payload_server, "0.5.23", mode="prefill", pool=1_100_000)

    def headroom(*extra: str) -> str:
        res = run("--prefill-url", p.url, "--profile", "glm-5.3-1m", "--format", "json", *extra)
        return [f["outcome"] for f in json.loads(res.stdout)["findings"] if f["check"] == "headroom"][0]

    assert headroom() == "failed"
    assert headroom("--headroom", "1.0") == "passed"


def test_junit_written_in_every_outcome(tmp_path: Path, payload_server: Callable[..., PayloadServer]) -> None:
    good = worker(payload_server, "0.5.22", pool=2_040_000)
    bad = worker(payload_server, "0.5.22", pool=681_280)
    cases = {
        0: ["--prefill-url", good.url, "--no-strict"],
        1: ["--prefill-url", bad.url],
        4: ["--prefill-url", f"http://127.0.0.1:{free_port()}"],
    }
    for code, args in cases.items():
        out = tmp_path / f"r{code}.xml"
        res = run(*args, "--format", "junit", "--output", str(out))
        assert res.exit_code == code, res.output
        root = ET.parse(out).getroot()
        assert int(root.get("tests", "0")) >= 1
        assert (root.get("failures") != "0") == (code == 1)
        assert (root.get("errors") != "0") == (code == 4)
        # A human still sees the verdict when every format went to a file.
        assert f"(exit {code})" in res.stdout


def test_several_formats_to_several_files(tmp_path: Path, payload_server: Callable[..., PayloadServer]) -> None:
    p = worker(payload_server, pool=681_280)
    files = [tmp_path / "r.json", tmp_path / "r.xml", tmp_path / "r.md"]
    res = run(
        "--prefill-url",
        p.url,
        "-f",
        "json",
        "-o",
        str(files[0]),
        "-f",
        "junit",
        "-o",
        str(files[1]),
        "-f",
        "markdown",
        "-o",
        str(files[2]),
    )
    assert res.exit_code == 1
    assert json.loads(files[0].read_text())["exit_status"] == 1
    ET.parse(files[1])
    assert "681,280" in files[2].read_text() and "| FAIL |" in files[2].read_text()


def test_bearer_token_is_sent_and_never_printed(tmp_path: Path, payload_server: Callable[..., PayloadServer]) -> None:
    token = "sk-kvgate-test-0123456789abcdef"
    good = worker(payload_server, pool=681_280)
    echo = payload_server({"/server_info": Route({"detail": f"bad token {token}"}, status=500)})
    outs = [tmp_path / "r.json", tmp_path / "r.xml", tmp_path / "r.md"]
    res = run(
        "--prefill-url",
        good.url,
        "--decode-url",
        echo.url,
        "--token-env",
        "KVGATE_TEST_TOKEN",
        "-f",
        "json",
        "-o",
        str(outs[0]),
        "-f",
        "junit",
        "-o",
        str(outs[1]),
        "-f",
        "markdown",
        "-o",
        str(outs[2]),
        env={"KVGATE_TEST_TOKEN": token},
    )
    assert res.exit_code == 1  # the failed pool wins over the transport error
    assert good.seen_headers[0].get("Authorization") == f"Bearer {token}"
    for text in [res.stdout, res.stderr, *(o.read_text() for o in outs)]:
        assert token not in text
    assert "***" in outs[0].read_text()


def test_missing_token_variable_is_a_usage_error() -> None:
    res = run("--prefill-url", "http://127.0.0.1:1", "--token-env", "KVGATE_NOT_SET_ANYWHERE")
    assert res.exit_code == ExitStatus.USAGE_ERROR and "KVGATE_NOT_SET_ANYWHERE" in res.stderr


def test_no_nodes_is_a_usage_error() -> None:
    res = run()
    assert res.exit_code == ExitStatus.USAGE_ERROR


def test_bad_format_name_is_a_usage_error() -> None:
    res = run("--prefill-url", "http://127.0.0.1:1", "--format", "yaml")
    assert res.exit_code == ExitStatus.USAGE_ERROR


@pytest.mark.parametrize(
    ("section", "key"),
    [("probes:\n  tenantz: 4\n", "probes.tenantz"), ("defenses:\n  trust_versio: true\n", "defenses.trust_versio")],
)
def test_a_typo_in_a_nested_profile_key_names_the_file(tmp_path: Path, section: str, key: str) -> None:
    """Issue 23: `probes.tenantz` in a profile named `mine` must name the FILE to edit, not `mine`."""
    prof = tmp_path / "p.yaml"
    prof.write_text("schema: 1\nname: mine\n" + section)
    res = run("--prefill-url", "http://127.0.0.1:1", "--profile", str(prof))
    assert res.exit_code == ExitStatus.USAGE_ERROR
    assert f"profile {prof}: key '{key}'" in res.stderr, res.stderr

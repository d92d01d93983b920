"""`kvgate plan` run in-process: verdicts, exit codes, formats, profiles, and knobs that really close the gap."""

from __future__ import annotations

import json
import math
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from kvgate.cli import app
from kvgate.exitcodes import ExitStatus
from kvgate.formats import ReportFormat

runner = CliRunner()
CONFIGS = Path(__file__).resolve().parents[1] / "plan" / "model_configs"
DSA = str(CONFIGS / "deepseek-v32-dsa.json")
GQA = str(CONFIGS / "llama-gqa.json")

# The incident's shape (incident.md section 1): a 1,048,576-token context on 8 x H200 with a measured
# weight figure that leaves the pool far short of context x 1.25.
INCIDENT = [
    "--model-config",
    DSA,
    "--gpu-memory-gib",
    "139.5",
    "--gpus-per-worker",
    "8",
    "--tp",
    "8",
    "--mem-fraction-static",
    "0.85",
    "--page-size",
    "64",
    "--context-length",
    "1048576",
    "--weights-gib",
    "84.5",
    "--release",
    "0.5.22",
]


def plan(*args: str) -> Any:
    return runner.invoke(app, ["plan", *args])


def doc_of(res: Any) -> dict[str, Any]:
    return json.loads(res.stdout)


def with_flag(argv: list[str], flag: str, value: str) -> list[str]:
    """argv with `flag` set to `value` (replaced if present)."""
    out = list(argv)
    if flag in out:
        out[out.index(flag) + 1] = value
    else:
        out += [flag, value]
    return out


def test_incident_shape_is_short_and_every_number_is_in_the_report() -> None:
    res = plan(*INCIDENT, "-f", "json")
    assert res.exit_code == ExitStatus.GATE_FAILED, res.output
    doc = doc_of(res)
    prefill = doc["target"]["prefill"]
    # By hand, from fleet.md section 3: DSA 512+64 latent, 61 layers, BF16 KV, indexer 128+4 bytes a layer.
    cell = (512 + 64) * 61 * 2 + (128 + 4) * 61
    assert cell == 78_324
    budget = int(((139.5 - 84.5) - 139.5 * (1 - 0.85)) * 2**30)
    expected = budget // cell // 64 * 64
    assert prefill["max_total_num_tokens"] == expected < 1_048_576
    assert prefill["max_req_input_len"] == expected - 1 - 5
    steps = {s["name"]: s for s in prefill["steps"]}
    assert steps["cell_size_bytes"]["value"] == cell and "indexer 132 B" in steps["cell_size_bytes"]["formula"]
    assert steps["kv_budget_bytes"]["value"] == budget and "0.85" in steps["kv_budget_bytes"]["formula"]
    assert steps["required_pool"]["value"] == math.ceil(1_048_576 * 1.25)
    bad = [f for f in doc["findings"] if f["outcome"] == "failed"]
    assert {f["node"] for f in bad} == {"prefill (planned)", "decode (planned)"}
    assert f"over-pool band ({expected:,}, 1,048,576]" in bad[0]["summary"]
    assert bad[0]["remedy"].startswith("any one of:")


def _knobs(res: Any) -> dict[str, Any]:
    finding = [f for f in doc_of(res)["findings"] if f["node"] == "prefill (planned)"][0]
    return {e["field"][len("knob ") :]: e["value"] for e in finding["evidence"] if e["field"].startswith("knob ")}


def test_each_possible_knob_alone_makes_the_plan_pass_and_impossible_ones_do_not() -> None:
    knobs = _knobs(plan(*INCIDENT, "-f", "json"))
    assert set(knobs) == {
        "--mem-fraction-static",
        "--tp",
        "--kv-cache-dtype",
        "--context-length",
        "--page-size",
        "--gpus-per-worker",
    }
    possible = {k: v for k, v in knobs.items() if v != "impossible"}
    assert possible, knobs
    for flag, value in possible.items():
        argv = with_flag(INCIDENT, flag, str(value))
        if flag == "--tp":
            argv = with_flag(argv, "--gpus-per-worker", str(8 * int(value) // 8))
            argv = with_flag(argv, "--weights-gib", str(84.5 * 8 / int(value)))
        if flag == "--gpus-per-worker":
            argv = with_flag(argv, "--pp", str(int(value) // 8))
            argv = with_flag(argv, "--weights-gib", str(84.5 * 8 / int(value)))
        res = plan(*argv, "-f", "json")
        assert res.exit_code == ExitStatus.PASSED, (flag, value, res.output)
    for flag in (k for k, v in knobs.items() if v == "impossible"):
        if flag == "--kv-cache-dtype":
            assert plan(*with_flag(INCIDENT, flag, "fp8_e4m3")).exit_code == ExitStatus.GATE_FAILED
        if flag == "--page-size":
            assert plan(*with_flag(INCIDENT, flag, "1")).exit_code == ExitStatus.GATE_FAILED


# A GQA worker on 8 GPUs of 139.5 GiB at the default memory fraction.
GQA_WORKER = ["--model-config", GQA, "--gpu-memory-gib", "139.5", "--tp", "8", "--mem-fraction-static", "0.85"]
# That worker a little short of its context: raising the memory fraction can close it.
SHORT_GQA = [*GQA_WORKER, "--page-size", "64", "--context-length", "2200000", "--weights-gib", "18.5"]


def test_the_mem_fraction_knob_is_the_smallest_that_fits() -> None:
    needed = float(_knobs(plan(*SHORT_GQA, "-f", "json"))["--mem-fraction-static"])
    assert 0.85 < needed <= 0.99
    assert plan(*with_flag(SHORT_GQA, "--mem-fraction-static", str(needed))).exit_code == ExitStatus.PASSED
    below = round(needed - 0.001, 3)
    assert plan(*with_flag(SHORT_GQA, "--mem-fraction-static", str(below))).exit_code == ExitStatus.GATE_FAILED


def test_the_context_knob_is_the_longest_that_fits() -> None:
    ctx = int(_knobs(plan(*INCIDENT, "-f", "json"))["--context-length"])
    assert plan(*with_flag(INCIDENT, "--context-length", str(ctx))).exit_code == ExitStatus.PASSED
    assert plan(*with_flag(INCIDENT, "--context-length", str(ctx + 1))).exit_code == ExitStatus.GATE_FAILED


# The same GQA worker at a 131,072-token context, which its pool holds.
GQA_131K = [*GQA_WORKER, "--context-length", "131072", "--weights-gib", "18.5"]


def test_a_pool_that_holds_the_context_passes() -> None:
    res = plan(*GQA_131K, "-f", "json")
    assert res.exit_code == ExitStatus.PASSED, res.output
    doc = doc_of(res)
    assert all(f["outcome"] == "passed" for f in doc["findings"]) and len(doc["findings"]) == 2
    assert doc["target"]["decode"]["fits"] is True


def test_a_cap_below_the_context_fails_and_names_the_cap_knob() -> None:
    res = plan(*GQA_131K, "--max-total-tokens", "100000", "-f", "json")
    assert res.exit_code == ExitStatus.GATE_FAILED
    assert doc_of(res)["target"]["prefill"]["max_total_num_tokens"] == 100_000
    knobs = _knobs(res)
    assert knobs["--max-total-tokens"] == math.ceil(131072 * 1.25)


def test_weights_that_leave_no_kv_memory_mean_the_worker_does_not_start() -> None:
    res = plan(*with_flag(INCIDENT, "--weights-gib", "125"), "-f", "json")
    assert res.exit_code == ExitStatus.GATE_FAILED
    summary = doc_of(res)["findings"][0]["summary"]
    assert "would not start" in summary and "no GPU memory for the KV cache" in summary


def test_the_estimate_is_used_and_labelled_when_no_weights_are_given() -> None:
    argv = [a for a in INCIDENT if a not in ("--weights-gib", "84.5")]
    doc = doc_of(plan(*argv, "-f", "json"))
    steps = {s["name"]: s for s in doc["target"]["prefill"]["steps"]}
    assert steps["weights_gib_per_gpu"]["formula"].startswith("ESTIMATE")


@pytest.mark.parametrize("fmt", list(ReportFormat))
def test_every_format_is_written_before_the_exit(fmt: ReportFormat, tmp_path: Path) -> None:
    out = tmp_path / f"plan.{fmt.value}"
    res = plan(*INCIDENT, "-f", fmt.value, "-o", str(out))
    assert res.exit_code == ExitStatus.GATE_FAILED
    text = out.read_text()
    if fmt is ReportFormat.JSON:
        assert json.loads(text)["exit_status"] == 1
    elif fmt is ReportFormat.JUNIT:
        assert ET.fromstring(text).find(".//failure") is not None
    else:
        assert "plan" in text and "failed" in text.lower()
    # the verdict still reaches the job log, without "do not promote": plan looked at no deployment
    assert "kvgate plan: GATE FAILED: this plan would not pass the gate (exit 1)" in res.stdout


@pytest.mark.parametrize(
    "argv, needle",
    [
        (
            ["--gpu-memory-gib", "139.5", "--tp", "8", "--mem-fraction-static", "0.85", "--context-length", "8192"],
            "--model-config",
        ),
        (with_flag(INCIDENT, "--model-config", "/nonexistent/config.json"), "cannot read"),
        (with_flag(INCIDENT, "--gpus-per-worker", "16"), "does not match the layout"),
        (with_flag(INCIDENT, "--release", "0.4.0"), "--release 0.4.0"),
        (with_flag(INCIDENT, "--kv-cache-dtype", "fp4_e2m1"), "FP4"),
        (with_flag(INCIDENT, "--mem-fraction-static", "1.5"), "--mem-fraction-static"),
    ],
)
def test_usage_errors_exit_2_with_a_report(argv: list[str], needle: str, tmp_path: Path) -> None:
    out = tmp_path / "r.json"
    res = plan(*argv, "-f", "json", "-o", str(out))
    assert res.exit_code == ExitStatus.USAGE_ERROR, res.output
    assert needle in res.stderr and "Traceback" not in res.output
    assert json.loads(out.read_text())["exit_status"] == 2


def test_malformed_and_unsupported_configs_exit_2_naming_the_file(tmp_path: Path) -> None:
    bad = tmp_path / "config.json"
    bad.write_text("{not json")
    res = plan(*with_flag(INCIDENT, "--model-config", str(bad)))
    assert res.exit_code == ExitStatus.USAGE_ERROR and str(bad) in res.stderr and "not valid JSON" in res.stderr
    swa = json.loads(Path(GQA).read_text()) | {"sliding_window": 4096}
    bad.write_text(json.dumps(swa))
    res = plan(*with_flag(INCIDENT, "--model-config", str(tmp_path)))  # a folder holding config.json
    assert res.exit_code == ExitStatus.USAGE_ERROR and "sliding_window" in res.stderr


def test_profile_deployment_section_plans_each_role(tmp_path: Path) -> None:
    prof = tmp_path / "p.yaml"
    prof.write_text(
        "schema: 1\nname: t\ncontext_length: 131072\nheadroom: 1.25\n"
        f"deployment:\n  model_config: {GQA}\n  gpu_memory_gib: 79.0\n  tp: 8\n  mem_fraction_static: 0.85\n"
        "  weights_gib: 18.5\n  decode:\n    attention_dp: true\n    dp: 8\n    kv_cache_dtype: fp8_e4m3\n"
    )
    res = plan("--profile", str(prof), "-f", "json")
    doc = doc_of(res)
    pre, dec = doc["target"]["prefill"], doc["target"]["decode"]
    dsteps = {s["name"]: s["value"] for s in dec["steps"]}
    assert dsteps["attn_tp_size"] == 1 and dsteps["dp_ranks"] == 8 and dsteps["kv_cache_dtype"] == "fp8_e4m3"
    # One KV head per rank either way (8 heads / tp 8, and 8 heads / attn-tp 1 = 8): decode's cell is 8 x 1/2.
    psteps = {s["name"]: s["value"] for s in pre["steps"]}
    assert dsteps["cell_size_bytes"] == psteps["cell_size_bytes"] * 8 // 2
    # Flags win over the profile.
    res2 = plan("--profile", str(prof), "--context-length", "4096", "-f", "json")
    assert doc_of(res2)["target"]["prefill"]["required"] == math.ceil(4096 * 1.25)


def test_profile_errors_name_the_key(tmp_path: Path) -> None:
    prof = tmp_path / "p.yaml"
    prof.write_text("schema: 1\ndeployment:\n  tp: eight\n")
    res = plan("--profile", str(prof))
    assert res.exit_code == ExitStatus.USAGE_ERROR and "deployment.tp" in res.stderr
    prof.write_text("schema: 1\ndeployment:\n  decode:\n    bogus: 1\n")
    res = plan("--profile", str(prof))
    assert res.exit_code == ExitStatus.USAGE_ERROR and "deployment.decode.bogus" in res.stderr


def test_the_readme_incident_plan_shows_what_the_command_prints() -> None:
    readme = (Path(__file__).resolve().parents[2] / "docs" / "usage.md").read_text()
    block = readme.split("### Plan the pool before the GPUs are paid for", 1)[1].split("```console\n", 1)[1]
    first = block.split("\n$ kvgate", 1)[0].replace("\\\n", " ").removeprefix("$ kvgate ").split()
    res = runner.invoke(app, first)
    assert res.exit_code == ExitStatus.GATE_FAILED, res.output
    shown = readme.split("The incident's shape planned", 1)[1].split("```text\n", 1)[1].split("```", 1)[0]
    numbers = {n for n in __import__("re").findall(r"\d[\d,]{4,}", shown)}
    assert numbers, shown
    for n in numbers:
        assert n in res.stdout, f"README shows {n}, `kvgate plan` does not print it"


def test_plan_wants_only_what_is_required_and_reads_as_english() -> None:
    """Issue 23: "(want ...)" only for the pool's requirement, never for a formula or a fact; and a knob that
    leaves no KV memory says "the worker would not start", never "even 0.99 gives the worker would not start"."""
    res = plan(*INCIDENT, "-f", "json")
    (pre,) = [f for f in doc_of(res)["findings"] if f["node"].startswith("prefill")]
    wants = {e["field"]: e["expected"] for e in pre["evidence"] if e["expected"]}
    assert list(wants.values()) == [">= 1,310,720"], wants
    assert any(k.startswith("max_total_num_tokens (") for k in wants)
    table = plan(*INCIDENT).stdout
    # prefill and decode alike print once, naming both nodes: the pool, nothing else
    assert table.count("(want ") == 1 and "2 nodes: prefill (planned), decode (planned)" in table, table
    argv = with_flag(with_flag(INCIDENT, "--gpu-memory-gib", "75"), "--mem-fraction-static", "0.5")
    starved = " ".join(plan(*with_flag(argv, "--weights-gib", "68.88")).stdout.split())
    assert "--kv-cache-dtype (with fp8_e4m3 the worker would not start)" in starved, starved
    assert "gives the worker would not start" not in starved and "(impossible: " not in starved


def test_plan_takes_up_s_tp_size_and_its_own_verbose() -> None:
    """`up` says --tp-size (SGLang's flag), `plan` says --tp: each accepts the other's spelling. The
    table's "--verbose for all" names a flag plan has."""
    as_tp = doc_of(plan(*INCIDENT, "-f", "json"))
    argv = list(INCIDENT)
    argv[argv.index("--tp")] = "--tp-size"
    as_tp_size = plan(*argv, "-f", "json")
    assert as_tp_size.exit_code == ExitStatus.GATE_FAILED
    assert doc_of(as_tp_size)["findings"] == as_tp["findings"]
    clash = plan(*INCIDENT, "--tp-size", "4")
    assert clash.exit_code == ExitStatus.USAGE_ERROR and "disagree" in clash.stdout
    passing = with_flag(INCIDENT, "--context-length", "65536")
    short, full = plan(*passing), plan(*passing, "--verbose")
    assert short.exit_code == full.exit_code == ExitStatus.PASSED
    assert "--verbose for all" in plan(*INCIDENT).stdout
    assert "passed: plan.pool x2" in short.stdout and "SGLang 0.5.22 sizes" in full.stdout  # the passed detail

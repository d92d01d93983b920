"""Issue 40, class 2, rebuilt: a signature is text, not code.

The fix scan matched substrings of the source file, so a fix whose call sites were commented out (or
sat in a string) read as present, while the same lines deleted blocked. A signature now counts only in
code the interpreter runs: on a copy of the REAL 0.5.23 wheel source, #38935's prefill call site
commented out, quoted in a string, moved into a docstring, or deleted reads as ABSENT each time, and
`kvgate fixes --site-packages` blocks naming the missing fix.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from kvgate.catalogue import Presence, assess_code, load_catalogue
from kvgate.catalogue import scanprog as S
from kvgate.catalogue.signatures import DirTree
from kvgate.catalogue.source import from_site_packages
from kvgate.cli import app
from tests.catalogue.helpers import copy_signature_tree

pytestmark = pytest.mark.wheels
runner = CliRunner()
CALL = "        if is_unadmitted_reject(req):\n"
BODY = "            self.scheduler.retire_unadmitted_request(req)\n            return\n"

# Each way of keeping the text of #38935's prefill call site while the code no longer runs it.
EDITS = {
    "commented out": "        if False:  # if is_unadmitted_reject(req):\n",
    "commented line": "        # if is_unadmitted_reject(req):\n        if False:\n",
    "in a string": '        if False and "if is_unadmitted_reject(req):":\n',
    "in a docstring": '        """Was: if is_unadmitted_reject(req):"""\n        if False:\n',
    "in a bare string": "        'if is_unadmitted_reject(req):'\n        if False:\n",
    "deleted": "        if False:\n",
}


def _site(tmp_path: Path, edit: str | None) -> Path:
    site = tmp_path / "site"
    pkg = copy_signature_tree("0.5.23", site / "sglang")
    if edit is not None:
        path = pkg / "srt/disaggregation/prefill.py"
        text = path.read_text()
        assert text.count(CALL + BODY) == 1
        path.write_text(text.replace(CALL + BODY, EDITS[edit] + BODY))
        compile(path.read_text(), str(path), "exec")  # still Python: only the call site changed
    return site


def test_the_real_source_carries_the_fix(tmp_path: Path) -> None:
    scan = from_site_packages(_site(tmp_path, None))
    assert assess_code(scan).status("pr-38935").presence is Presence.PRESENT


@pytest.mark.parametrize("edit", list(EDITS))
def test_a_call_site_that_does_not_run_reads_absent(tmp_path: Path, edit: str) -> None:
    site = _site(tmp_path, edit)
    status = assess_code(from_site_packages(site)).status("pr-38935")
    assert status.presence is Presence.ABSENT, (edit, status)
    # The in-process tree reader agrees with the scan program.
    fix = load_catalogue().get("pr-38935")
    assert DirTree(site / "sglang").scan([fix])["pr-38935"].presence is Presence.ABSENT
    res = runner.invoke(app, ["fixes", "--quiet", "--site-packages", str(site), "-f", "json"])
    assert res.exit_code == 1, res.output
    doc = json.loads(res.stdout)
    failed = [f for f in doc["findings"] if f["outcome"] == "failed"]
    assert any("38935" in f["summary"] or f["check"] == "pr-38935" for f in failed), failed


def test_messages_count_only_inside_a_string_the_code_uses() -> None:
    src = b'''"""Module docstring: KV checksum mismatch; def install_canary("""
import logging
# def install_canary(
X = {"routed_dp_rank": 1}


def install_canary(pool):
    """def retire_unadmitted_request( in a docstring"""
    "KV checksum mismatch in a bare string"
    logging.error("KV checksum mismatch %s", pool)
    return f"{pool} def poison_deferred_ack_room("
'''
    code = S.Code(src)

    def hit(p: str) -> bool:
        return bool(S.pattern_matcher(p)(code))

    assert hit("sub:def install_canary(") and hit("ssub:KV checksum mismatch")
    assert hit("ssub:routed_dp_rank") and not hit("sub:routed_dp_rank")
    assert not hit("sub:def retire_unadmitted_request(") and not hit("ssub:def retire_unadmitted_request(")
    assert not hit("sub:def poison_deferred_ack_room(")  # only inside an f-string's text
    assert not hit("sub:KV checksum mismatch")  # a message is not code
    assert hit("asub:KV checksum mismatch") and hit("txt:# def install_canary(")
    assert not hit("asub:in a bare string") and not hit("asub:Module docstring")
    # A string that opens an expression is code; one that a backslash continues is too.
    assert S.pattern_matcher("ssub:routed")(S.Code(b'x = (\n    "routed"\n)\ny = 1 + \\\n    "routed"\n'))
    assert not S.pattern_matcher("ssub:routed")(S.Code(b'def f():\n    "routed"\n    return 1\n'))
    assert S.pattern_matcher("ssub:routed")(S.Code(b'def f():\n    "routed".join(x)\n'))
    # CRLF line ends and a regex anchored at a line start.
    crlf = S.Code(b"class A:\r\n    enable_deferred_decode_kv_release: bool = False\r\n")
    assert S.pattern_matcher("re:^    enable_deferred_decode_kv_release: bool = False")(crlf)

"""``fleetctl report``: one run, every format parsed back, history over three nights, the
allowlist, ``--fail-on``, and output files written whole.

The fleet is real: a git-committed project shipped to local hosts by ``fleetctl ship``, then
changed by hand on the host the way a person would (a file edited, a file with a hostile name
dropped in). What the report must say is computed here from those edits, not from fleetctl.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import xml.etree.ElementTree as ET
from pathlib import Path

import jsonschema
from junitparser import Error, Failure, JUnitXml, Skipped

from tests.helpers import cli, commit_project, git, local_host, make_project, write_inventory
from tests.commands.test_credentials import host_root  # noqa: F401 - the secrets test's fixture

REPO = Path(__file__).resolve().parents[2]
SCHEMA = json.loads((REPO / "docs" / "report.schema.json").read_text())
HOSTILE = "<img src=x onerror=alert(1)> | `tick` [a](b) <svg onload=alert(2)> *x*.txt"
"""A file name a person (or an intruder) could leave on a host: markup, a table pipe, a code
span, a link, emphasis."""


def make_fleet(base: Path, hosts: tuple[str, ...] = ("h1", "h2"),
               agents: dict | None = None, roles: dict | None = None) -> tuple[Path, Path]:
    """A committed project with two docs files, shipped to local hosts; returns (inventory,
    blueprint)."""
    bp = make_project(base, {"runner": {"a.txt": "a\n", "b.txt": "b\n", "c.txt": "c\n"}},
                      roles=roles, use_git=False)
    if agents:  # the token audit measures the prefix with the blueprint's own runner
        shutil.copytree(REPO / "blueprint" / "runner", bp / "runner", dirs_exist_ok=True,
                        ignore=shutil.ignore_patterns("__pycache__"))
    commit_project(base)
    inv = write_inventory(base / "inventory.yaml", {
        h: local_host(base / "boxes" / h, agents if agents is not None else {}) for h in hosts})
    shipped = cli("ship", "--yes", "--format", "json", inventory=inv, blueprint=bp)
    assert shipped.code == 0, shipped.stdout + shipped.stderr
    return inv, bp


def live(base: Path, host: str) -> Path:
    return base / "boxes" / host / "current"


def report(inv: Path, bp: Path, *args: str):
    return cli("report", "--format", "json", *args, inventory=inv, blueprint=bp)


def key(check: str, host: str, kind: str, subject: str) -> str:
    """The finding id, computed here: 16 hex digits of sha256 of the identity, NUL-joined."""
    return hashlib.sha256("\0".join((check, host, kind, subject)).encode()).hexdigest()[:16]


def identities(doc: dict, *states: str) -> set[tuple[str, str, str, str]]:
    return {(f["check"], f["host"], f["kind"], f["subject"]) for f in doc["findings"]
            if not states or f["state"] in states}


def md_cells(row: str) -> list[str]:
    """A GFM table row split on its unescaped pipes (the first and last are the borders)."""
    return re.split(r"(?<!\\)\|", row)[1:-1]


def test_every_format_parsed_back_and_host_names_escaped(tmp_path):
    """A hand-patched file and a hostile file name on h1, nothing on h2: JSON (against its
    schema), JUnit (junitparser and ElementTree), Markdown and HTML say the same, and the
    hostile name is text in every one of them."""
    inv, bp = make_fleet(tmp_path)
    (live(tmp_path, "h1") / "runner" / "a.txt").write_text("patched by hand\n")
    (live(tmp_path, "h1") / "runner" / HOSTILE).write_text("x\n")
    out = tmp_path / "out"
    out.mkdir()
    run = cli("report", "--format", "json", "--markdown", str(out / "r.md"), "--junit",
              str(out / "r.xml"), "--html", str(out / "r.html"), "--json", str(out / "r.json"),
              "--no-ledgers", inventory=inv, blueprint=bp)
    assert run.code == 1, run.stdout + run.stderr
    doc = run.doc
    jsonschema.Draft202012Validator(SCHEMA).validate(doc)
    assert json.loads((out / "r.json").read_text()) == doc
    expected = {("drift", "h1", "hand-patch", "runner/a.txt"),
                ("drift", "h1", "hand-patch", f"runner/{HOSTILE}")}
    assert identities(doc) == expected
    assert {f["id"] for f in doc["findings"]} == {key(*k) for k in expected}
    assert all(f["state"] == "new" and f["fails"] and f["nights"] == 1
               for f in doc["findings"])
    assert doc["source"]["commit"] and doc["source"]["clean"] is True
    by_host = {h["host"]: h for h in doc["hosts"]}
    assert by_host["h1"]["commit"] == doc["source"]["commit"] == by_host["h2"]["commit"]
    assert {(c["host"], c["check"]): c["status"] for c in doc["checks"]} == {
        ("h1", "drift"): "findings", ("h1", "creds"): "ok", ("h1", "tokens"): "skipped",
        ("h2", "drift"): "ok", ("h2", "creds"): "ok", ("h2", "tokens"): "skipped"}

    # JUnit: parsed by a maintained library, and well-formed XML for a plain parser.
    ET.parse(out / "r.xml")
    xml = JUnitXml.fromfile(str(out / "r.xml"))
    cases = {(suite.name, case.name): case for suite in xml for case in suite}
    assert set(cases) == {(f"fleetctl report: {c}", h) for c in ("drift", "creds", "tokens")
                          for h in ("h1", "h2")}
    h1 = cases[("fleetctl report: drift", "h1")]
    failures = [r for r in h1.result if isinstance(r, Failure)]
    assert len(failures) == 1 and failures[0].type == "hand-patch"
    assert HOSTILE in failures[0].text and "runner/a.txt" in failures[0].text
    assert cases[("fleetctl report: drift", "h2")].is_passed
    assert all(isinstance(r, Skipped) for c in ("h1", "h2")
               for r in cases[("fleetctl report: tokens", c)].result)
    assert xml.failures == 1 and xml.errors == 0

    # Markdown: no tag from the host survives, every table row keeps its columns.
    md = (out / "r.md").read_text()
    assert "<img" not in md and "<svg onload" not in md
    assert not re.search(r"(?<!\\)\[a(?<!\\)\]\(b\)", md) and "\\[a\\](b)" in md  # no link
    assert "&lt;img src=x onerror=alert(1)>" in md
    for line in md.splitlines():
        if line.startswith("| fails |") or line.startswith("| **fails** |"):
            assert len(md_cells(line)) == 7, line
        elif line.startswith("| host |") or line.startswith("| h"):
            assert len(md_cells(line)) == 9, line
    assert "### New tonight: 2 finding(s), 2 failing" in md

    # HTML: the name is escaped text (the browser check is in test_report_html.py).
    page = (out / "r.html").read_text()
    assert "<img src=x" not in page and "<svg onload" not in page
    assert "&lt;img src=x onerror=alert(1)&gt;" in page


def test_three_nights_new_persisting_resolved_and_fail_on_new(tmp_path):
    """Night 1: a.txt and b.txt patched (both new). Night 2: a.txt restored, c.txt patched:
    a resolved, b persisting for 2 nights since night 1, c new. Night 3: b restored: b
    resolved, c persisting. With --fail-on new, night 2 fails (c is new) and night 3 does not."""
    inv, bp = make_fleet(tmp_path, hosts=("h1",))
    docs = live(tmp_path, "h1") / "runner"
    hist = tmp_path / "history"
    n1, n2, n3 = "2026-11-28T02:00:00Z", "2026-11-29T02:00:00Z", "2026-11-30T02:00:00Z"

    def sub(name: str) -> tuple[str, str, str, str]:
        return ("drift", "h1", "hand-patch", f"runner/{name}")

    (docs / "a.txt").write_text("A\n")
    (docs / "b.txt").write_text("B\n")
    first = report(inv, bp, "--history", str(hist), "--now", n1, "--fail-on", "new")
    assert first.code == 1, first.stderr
    assert identities(first.doc, "new") == {sub("a.txt"), sub("b.txt")}
    assert first.doc["previous"] is None

    (docs / "a.txt").write_text("a\n")
    (docs / "c.txt").write_text("C\n")
    second = report(inv, bp, "--history", str(hist), "--now", n2, "--fail-on", "new")
    assert second.code == 1, second.stderr
    d2 = second.doc
    assert d2["previous"] == n1
    assert identities(d2, "new") == {sub("c.txt")}
    assert identities(d2, "persisting") == {sub("b.txt")}
    assert identities(d2, "resolved") == {sub("a.txt")}
    b = next(f for f in d2["findings"] if f["subject"] == "runner/b.txt")
    assert (b["since"], b["nights"], b["fails"]) == (n1, 2, False)
    assert [(f["subject"], f["fails"]) for f in d2["findings"] if f["fails"]] == [
        ("runner/c.txt", True)]
    assert (d2["summary"]["new"], d2["summary"]["persisting"], d2["summary"]["resolved"]) == \
        (1, 1, 1)

    (docs / "b.txt").write_text("b\n")
    third = report(inv, bp, "--history", str(hist), "--now", n3, "--fail-on", "new")
    assert third.code == 0, third.stdout + third.stderr
    d3 = third.doc
    assert identities(d3, "persisting") == {sub("c.txt")}
    assert identities(d3, "resolved") == {sub("b.txt")}
    assert identities(d3, "new") == set()
    c = next(f for f in d3["findings"] if f["subject"] == "runner/c.txt")
    assert (c["since"], c["nights"]) == (n2, 2)
    # The chart's data: one entry per night, counts as this test made them.
    assert [(n["generated"], n["findings"], n["new"]) for n in d3["nights"]] == [
        (n1, 2, 2), (n2, 2, 1), (n3, 1, 0)]
    kept = sorted(p.name for p in hist.iterdir())
    assert kept == ["2026-11-28T020000Z.json", "2026-11-29T020000Z.json",
                    "2026-11-30T020000Z.json"]
    assert json.loads((hist / kept[-1]).read_text()) == d3
    # The same night without --fail-on new fails on the persisting finding.
    again = report(inv, bp, "--now", n3)
    assert again.code == 1


def test_allowlist_live_and_expired_entries(tmp_path):
    """Two patched files, each accepted: the entry for a.txt is live (expires tomorrow), the
    one for b.txt expired yesterday. a.txt shows as accepted and does not fail; b.txt fails
    again. On the expiry date itself the entry still holds."""
    inv, bp = make_fleet(tmp_path, hosts=("h1",))
    docs = live(tmp_path, "h1") / "runner"
    (docs / "a.txt").write_text("A\n")
    (docs / "b.txt").write_text("B\n")
    allow = tmp_path / "accepted.yaml"
    allow.write_text(
        "accept:\n"
        "  - host: h1\n    path: runner/a.txt\n    kind: hand-patch\n"
        "    reason: tuning agreed in OPS-12\n    expires: 2026-12-02\n"
        "  - host: '*'\n    path: runner/b.txt\n    kind: hand-patch\n"
        "    reason: temporary\n    expires: 2026-11-30\n")
    run = report(inv, bp, "--allowlist", str(allow), "--now", "2026-12-01T03:00:00Z")
    assert run.code == 1, run.stderr
    doc = run.doc
    jsonschema.Draft202012Validator(SCHEMA).validate(doc)
    a = next(f for f in doc["findings"] if f["subject"] == "runner/a.txt")
    b = next(f for f in doc["findings"] if f["subject"] == "runner/b.txt")
    assert a["accepted"]["reason"] == "tuning agreed in OPS-12" and a["fails"] is False
    assert b["accepted"] is None and b["expired"]["expires"] == "2026-11-30" and b["fails"]
    assert [e["expires"] for e in doc["allowlist"]["expired"]] == ["2026-11-30"]
    # Only a.txt patched, its entry live: clean run.
    (docs / "b.txt").write_text("b\n")
    assert report(inv, bp, "--allowlist", str(allow), "--now", "2026-12-02T23:59:59Z").code == 0
    # The day after its expiry date it fails again, and --fail-on new does not hide that.
    later = report(inv, bp, "--allowlist", str(allow), "--now", "2026-12-03T00:00:00Z",
                   "--fail-on", "new")
    assert later.code == 1
    assert [f["subject"] for f in later.doc["findings"] if f["fails"]] == ["runner/a.txt"]


def test_allowlist_errors_name_file_and_line(tmp_path):
    inv, bp = make_fleet(tmp_path, hosts=("h1",))
    allow = tmp_path / "accepted.yaml"
    allow.write_text("accept:\n  - host: h1\n    path: runner/a.txt\n    kind: hand-patch\n"
                     "    reason: r\n    expires: someday\n")
    run = report(inv, bp, "--allowlist", str(allow))
    assert run.code == 2 and run.stdout == ""
    assert "accepted.yaml:6: accept[0].expires: 'someday' is not a date" in run.stderr
    assert "Traceback" not in run.stderr
    allow.write_text("accept:\n  - host: h1\n    path: runner/a.txt\n    kind: handpatch\n"
                     "    reason: r\n    expires: 2027-01-01\n")
    run = report(inv, bp, "--allowlist", str(allow))
    assert run.code == 2 and "accepted.yaml:4: accept[0].kind: unknown kind 'handpatch'" in \
        run.stderr


def test_fail_on_kinds(tmp_path):
    """Only a hand-patch on h1: --fail-on conflict passes, hand-patch and drift fail, none
    passes; an unknown word is a usage error naming it."""
    inv, bp = make_fleet(tmp_path, hosts=("h1",))
    (live(tmp_path, "h1") / "runner" / "a.txt").write_text("A\n")
    assert report(inv, bp, "--fail-on", "conflict,unknown").code == 0
    assert report(inv, bp, "--fail-on", "conflict,hand-patch").code == 1
    assert report(inv, bp, "--fail-on", "drift").code == 1
    assert report(inv, bp, "--fail-on", "creds,tokens").code == 0
    assert report(inv, bp, "--fail-on", "none").code == 0
    bad = report(inv, bp, "--fail-on", "hand_patch")
    assert bad.code == 2 and "--fail-on: unknown hand_patch" in bad.stderr
    assert "Traceback" not in bad.stderr


def test_output_files_whole_or_replaced_by_the_error(tmp_path):
    """Last night's files are never left in place by a run that fails before it can report:
    each is replaced, whole, by a document saying why; no temporary file stays behind."""
    inv, bp = make_fleet(tmp_path, hosts=("h1",))
    out = tmp_path / "out"
    out.mkdir()
    files = {"json": out / "r.json", "markdown": out / "r.md", "junit": out / "r.xml",
             "html": out / "r.html"}
    for path in files.values():
        path.write_text("LAST NIGHT\n")
    args = [a for fmt, p in files.items() for a in (f"--{fmt}", str(p))]
    run = cli("report", "nosuchhost", *args, inventory=inv, blueprint=bp)
    assert run.code == 2
    assert "nosuchhost" in run.stderr and "Traceback" not in run.stderr
    for path in files.values():
        assert "LAST NIGHT" not in path.read_text()
        assert "nosuchhost" in path.read_text()
    assert json.loads(files["json"].read_text())["exit_code"] == 2
    failed = JUnitXml.fromfile(str(files["junit"]))
    assert [type(r) for s in failed for c in s for r in c.result] == [Error]
    assert sorted(p.name for p in out.iterdir()) == ["r.html", "r.json", "r.md", "r.xml"]
    # An output directory that does not exist: exit 2 with the file named, nothing written.
    missing = tmp_path / "nope" / "r.json"
    run = cli("report", "--json", str(missing), "--no-ledgers", inventory=inv, blueprint=bp)
    assert run.code == 2 and "nope/r.json" in run.stderr and not missing.parent.exists()


def test_unreachable_host_is_an_error_and_the_others_are_reported(tmp_path):
    inv, bp = make_fleet(tmp_path, hosts=("h1",))
    body = json.loads(json.dumps(__import__("yaml").safe_load(inv.read_text())))
    body["hosts"]["down"] = {"transport": "ssh", "address": "127.0.0.1", "port": 1,
                             "user": "root", "root": "/srv/fleet", "agents": {}}
    inv.write_text(__import__("yaml").safe_dump(body))
    (live(tmp_path, "h1") / "runner" / "a.txt").write_text("A\n")
    run = report(inv, bp, "--timeout", "10")
    assert run.code == 2, run.stdout + run.stderr
    doc = run.doc
    checks = {(c["host"], c["check"]): c for c in doc["checks"]}
    assert checks[("down", "drift")]["status"] == "error"
    assert checks[("down", "drift")]["error"]
    assert checks[("h1", "drift")]["status"] == "findings"
    assert identities(doc) == {("drift", "h1", "hand-patch", "runner/a.txt")}


def test_token_budget_findings_per_agent(tmp_path):
    """A role whose budget is 1 token: every agent of it is over; the finding's identity is
    (tokens, host, budget_tokens, agent) and its JUnit case fails."""
    inv, bp = make_fleet(tmp_path, hosts=("h1",), agents={"w1": {"role": "worker"}},
                         roles={"worker": {"prompt": "work", "budget_tokens": 1}})
    out = tmp_path / "r.xml"
    run = report(inv, bp, "--junit", str(out))
    assert run.code == 1, run.stdout + run.stderr
    tokens = [f for f in run.doc["findings"] if f["check"] == "tokens"]
    assert [(f["host"], f["kind"], f["subject"]) for f in tokens] == [
        ("h1", "budget_tokens", "w1")]
    assert tokens[0]["detail"]["limit"] == 1 and tokens[0]["detail"]["actual"] > 1
    xml = JUnitXml.fromfile(str(out))
    case = next(c for s in xml if s.name == "fleetctl report: tokens" for c in s)
    assert [r.type for r in case.result] == ["budget_tokens"]
    # The agent has no ledger yet: the chart says so, and that is not an error.
    assert [(a["agent"], a["status"], a["turns"]) for a in run.doc["agents"]] == [
        ("w1", "missing", 0)]


def test_credentials_findings_accepted_the_same_way(tmp_path):
    """An agent without a user of its own is a creds finding (rule no-own-user, subject the
    agent); an entry naming that rule accepts it, so the run is clean."""
    inv, bp = make_fleet(tmp_path, hosts=("h1",), agents={"w1": {"role": "worker"}})
    first = report(inv, bp, "--fail-on", "creds")
    assert first.code == 1, first.stdout + first.stderr
    creds = [(f["kind"], f["subject"]) for f in first.doc["findings"] if f["check"] == "creds"]
    assert ("no-own-user", "w1") in creds
    allow = tmp_path / "accepted.yaml"
    allow.write_text("accept:\n" + "".join(
        f"  - host: h1\n    check: creds\n    rule: {k}\n    subject: {s}\n"
        f"    reason: demo box, no users\n    expires: 2099-01-01\n" for k, s in creds))
    run = report(inv, bp, "--fail-on", "creds", "--allowlist", str(allow))
    assert run.code == 0, run.stdout + run.stderr
    assert all(f["accepted"]["reason"] == "demo box, no users"
               for f in run.doc["findings"] if f["check"] == "creds")
    assert run.doc["allowlist"]["unused"] == []


def test_a_host_not_checked_keeps_its_findings_history(tmp_path):
    """Night 2 cannot reach h1: its finding is 'unchecked' (not resolved, not failing) and the
    run is exit 2; night 3 reaches it again: the finding persists, seen since night 1."""
    import yaml

    inv, bp = make_fleet(tmp_path, hosts=("h1",))
    (live(tmp_path, "h1") / "runner" / "a.txt").write_text("A\n")
    hist = tmp_path / "history"
    n1, n2, n3 = "2026-11-28T02:00:00Z", "2026-11-29T02:00:00Z", "2026-11-30T02:00:00Z"
    assert report(inv, bp, "--history", str(hist), "--now", n1).code == 1
    good = inv.read_text()
    body = yaml.safe_load(good)
    body["hosts"]["h1"] = {"transport": "ssh", "address": "127.0.0.1", "port": 1,
                           "user": "root", "root": "/srv/fleet", "agents": {}}
    inv.write_text(yaml.safe_dump(body))
    page = tmp_path / "night2.html"
    second = report(inv, bp, "--history", str(hist), "--now", n2, "--timeout", "10", "--html",
                    str(page))
    assert second.code == 2
    assert [(f["subject"], f["state"], f["fails"]) for f in second.doc["findings"]] == [
        ("runner/a.txt", "unchecked", False)]
    # The chart's night is not a night with fewer findings: the one carried is counted apart.
    assert [(n["findings"], n["unchecked"]) for n in second.doc["nights"]] == [(1, 0), (0, 1)]
    assert "and 1 earlier finding(s) not checked (carried)" in page.read_text()
    assert "<td>0 (+1 not checked)</td>" in page.read_text()
    from fleetctl.cli.output.nightly import to_markdown

    md = to_markdown(second.doc)
    (row,) = [line for line in md.splitlines() if line.startswith("| h1 |")]
    assert md_cells(row)[6].strip() == "0 (+1 not checked)"
    inv.write_text(good)
    third = report(inv, bp, "--history", str(hist), "--now", n3)
    assert third.code == 1
    assert [(f["subject"], f["state"], f["since"]) for f in third.doc["findings"]] == [
        ("runner/a.txt", "persisting", n1)]


def _doc_with(findings: int, hosts: int = 3, persisting_every: int = 0) -> dict:
    """A report document built through the library from synthetic findings (no hosts). With
    ``persisting_every`` N, every Nth finding was there the night before too (``persisting``);
    the others are new."""
    from fleetctl import nightly

    report_ = nightly.NightlyReport(
        generated="2026-12-01T03:00:00Z",
        source={"commit": "0123456789abcdef0123456789abcdef01234567", "clean": True,
                "dirty": []},
        hosts=[{"host": f"host{h}", "status": "drift", "release": "20261130T020000000Z-aaaa",
                "commit": "0123456789abcdef0123456789abcdef01234567", "identity": f"host{h}",
                "ancestry": None, "ship_in_progress": None} for h in range(hosts)],
        checks=[nightly.CheckResult(f"host{h}", c, "findings" if c == "drift" else "ok")
                for h in range(hosts) for c in nightly.CHECKS],
        findings=[nightly.Finding("drift", f"host{i % hosts}", "hand-patch",
                                  f"skills/s{i}/bin/{'x' * 40}-{i}|{HOSTILE}",
                                  f"skills/s{i}/bin/tool-{i}: content (hand-patch)", "high")
                  for i in range(findings)])
    previous = None
    if persisting_every:
        previous = {"generated": "2026-11-30T03:00:00Z", "findings": [
            {"check": f.check, "host": f.host, "kind": f.kind, "subject": f.subject,
             "state": "new", "since": "2026-11-30T03:00:00Z", "nights": 1}
            for i, f in enumerate(report_.findings) if i % persisting_every == 0]}
    nightly.judge(report_, previous, None, nightly.parse_fail_on("all"))
    return nightly.report_document(report_)


def test_markdown_snapshot():
    """The Markdown of a fixed document, byte for byte (tests/data/report-snapshot.md)."""
    from fleetctl.cli.output.nightly import to_markdown

    expected = (Path(__file__).parents[1] / "data" / "report-snapshot.md").read_text()
    assert to_markdown(_doc_with(4, hosts=2)) == expected


def test_markdown_stays_well_under_the_summary_limit_new_findings_first():
    """20 000 findings over 50 hosts, every third persisting from the night before: the summary
    is at most half of GitHub's 1 MiB (the budget), keeps the whole hosts' table, shows new
    findings before any persisting one and no persisting one while a new one is left out,
    and its last line says how many were left out (counted here from the rows) and names the
    files that hold every finding. GitHub's limit is 1 048 576 bytes per step
    (actions/runner#1839)."""
    from fleetctl.cli.output.nightly import MARKDOWN_BUDGET_BYTES, MARKDOWN_LIMIT_BYTES, \
        to_markdown

    total = 20000
    persisting = len(range(0, total, 3))
    md = to_markdown(_doc_with(total, hosts=50, persisting_every=3),
                     elsewhere=("reports/report.json", "reports/report.html"))
    size = len(md.encode("utf-8"))
    assert MARKDOWN_LIMIT_BYTES == 1024 * 1024 and MARKDOWN_BUDGET_BYTES == 512 * 1024
    assert MARKDOWN_BUDGET_BYTES - 8192 < size <= MARKDOWN_BUDGET_BYTES
    lines = md.splitlines()
    assert sum(1 for line in lines if re.match(r"\| host\d+ \|", line)) == 50
    # Each finding row names its finding by subject: s{i}, and i % 3 == 0 was there before.
    shown = [int(m.group(1)) for line in lines
             if (m := re.match(r"\| \*\*fails\*\* \| host\d+ \| drift \| hand-patch \| "
                               r"skills/s(\d+)/", line))]
    kinds = ["persisting" if i % 3 == 0 else "new" for i in shown]
    assert kinds and kinds[0] == "new"
    assert kinds == sorted(kinds)  # every new row before every persisting one
    new_shown, old_shown = kinds.count("new"), kinds.count("persisting")
    assert new_shown < total - persisting and old_shown == 0  # new ones left out: no old
    m = re.search(r"\*\*Truncated\*\* to stay within 512 KiB .*: (\d+) of 20000 findings left "
                  r"out \((\d+) new, (\d+) persisting", md)
    assert m, md[-600:]
    assert [int(x) for x in m.groups()] == [total - len(shown),
                                            total - persisting - new_shown, persisting]
    assert "`reports/report.json`, `reports/report.html`" in lines[-1]
    assert md.count("<details>") == md.count("</details>")
    small = to_markdown(_doc_with(10, hosts=2, persisting_every=3))
    assert "Truncated" not in small
    assert small.index("### New tonight: 6 finding(s)") < small.index("Persisting: 4 finding(s)")


def test_markdown_of_a_very_large_fleet_stays_under_the_budget():
    """3 000 hosts with a finding each: under the budget, the hosts needing attention first
    in the table, and the note counts the host rows left out."""
    from fleetctl.cli.output.nightly import MARKDOWN_BUDGET_BYTES, to_markdown

    md = to_markdown(_doc_with(3000, hosts=3000))
    assert len(md.encode("utf-8")) <= MARKDOWN_BUDGET_BYTES
    rows = sum(1 for line in md.splitlines() if re.match(r"\| host\d+ \|", line))
    m = re.search(r"(\d+) host row\(s\)", md)
    assert m and rows + int(m.group(1)) == 3000 and rows > 100


def test_undecodable_and_control_characters_in_names(tmp_path):
    """A name with a byte that is not UTF-8 and a terminal escape: the JSON subject is the
    reversible escape (json.md), and no raw control character reaches Markdown, JUnit (which
    must stay XML 1.0) or HTML."""
    inv, bp = make_fleet(tmp_path, hosts=("h1",))
    raw = b"bad-\xff-\x1b[31m-red.txt"
    with open(os.path.join(os.fsencode(live(tmp_path, "h1") / "runner"), raw), "wb") as fh:
        fh.write(b"x\n")
    out = tmp_path / "out"
    out.mkdir()
    run = cli("report", "--format", "json", "--markdown", str(out / "r.md"), "--junit",
              str(out / "r.xml"), "--html", str(out / "r.html"), "--no-ledgers",
              inventory=inv, blueprint=bp)
    assert run.code == 1, run.stdout + run.stderr
    (finding,) = run.doc["findings"]
    assert finding["subject"] == "runner/bad-\\xff-\x1b[31m-red.txt"
    ET.parse(out / "r.xml")
    for name in ("r.md", "r.xml", "r.html"):
        text = (out / name).read_text(encoding="utf-8")
        assert "\x1b" not in text, name
        shown = text.replace("\\\\", "\\").replace("\\[", "[")  # Markdown's escapes undone
        assert "bad-\\xff-\\x1b[31m-red.txt" in shown, name


def test_a_rotated_secret_is_reported_by_digest_only(tmp_path, host_root, real_users,
                                                      monkeypatch):
    """A grant's secret rotated since the ship: the report has a pending finding for the
    credential file, marked secret, in every format, and neither value in any of them."""
    from tests.commands.test_credentials import Fleet, tok

    fleet = Fleet(tmp_path, host_root, real_users, monkeypatch)
    shutil.copytree(REPO / "blueprint" / "runner", fleet.bp / "runner", dirs_exist_ok=True,
                    ignore=shutil.ignore_patterns("__pycache__"))
    git(tmp_path, "add", "-A")
    git(tmp_path, "commit", "-qm", "the real runner (the token audit measures with it)")
    old = fleet.secret("TOK_A")
    fleet.configure(grants_a=tok("TOK_A"))
    assert fleet.run("ship", "--yes").code == 0
    new = fleet.secret("TOK_A")
    out = tmp_path / "out"
    out.mkdir()
    run = fleet.run("report", "--format", "text", "--json", str(out / "r.json"), "--markdown",
                    str(out / "r.md"), "--junit", str(out / "r.xml"), "--html",
                    str(out / "r.html"), "--no-ledgers", "--fail-on", "drift")
    assert run.code == 1, run.stdout + run.stderr
    doc = json.loads((out / "r.json").read_text())
    (finding,) = [f for f in doc["findings"] if f["check"] == "drift"]
    assert (finding["kind"], finding["subject"]) == ("pending", "credentials/a/tok.env")
    (change,) = finding["detail"]["changes"]
    assert change["secret"] is True and change["after"]["digest"].startswith("sha256:")
    assert "secret: digests only" in finding["message"]
    for text in [run.stdout, run.stderr] + [p.read_text() for p in out.iterdir()]:
        assert old not in text and new not in text


def test_a_grant_whose_secret_is_not_available_is_named_not_failed(tmp_path, host_root,
                                                                   real_users, monkeypatch):
    """CI without one grant's secret: the report still runs; the host names the unchecked
    grant (agent, capability, the variable) in JSON, text and Markdown, and nothing fails for
    it."""
    from tests.commands.test_credentials import Fleet, tok

    fleet = Fleet(tmp_path, host_root, real_users, monkeypatch)
    fleet.secret("TOK_A")
    fleet.configure(grants_a=tok("TOK_A"))
    assert fleet.run("ship", "--yes").code == 0
    monkeypatch.delenv("TOK_A")
    md = tmp_path / "r.md"
    junit = tmp_path / "r.xml"
    run = fleet.run("report", "--format", "json", "--markdown", str(md), "--junit", str(junit),
                    "--no-ledgers", "--fail-on", "drift")
    assert run.code in (0, 2), run.stdout + run.stderr  # tokens: no runner in this blueprint
    jsonschema.Draft202012Validator(SCHEMA).validate(run.doc)
    (host,) = run.doc["hosts"]
    (u,) = host["unchecked_grants"]
    assert (u["agent"], u["capability"]) == ("a", "tok") and "TOK_A" in u["source_name"]
    assert [f for f in run.doc["findings"] if f["check"] == "drift"] == []
    shown = md.read_text().replace("\\_", "_")  # Markdown's escape of "_" undone
    assert "unchecked: a/tok: environment variable TOK_A" in shown
    text = fleet.run("report", "--no-ledgers", "--fail-on", "drift")
    assert "unchecked: a/tok: environment variable TOK_A" in text.stdout
    # The drift check ran in part: never a plain "ok" nor a passing JUnit case.
    (drift,) = [c for c in run.doc["checks"] if c["check"] == "drift"]
    assert drift["status"] == "ok" and len(drift["not_checked"]) == 1
    assert "TOK_A" in drift["not_checked"][0]
    assert "drift: ok, 1 not checked" in text.stdout
    assert "| ok, 1 not checked |" in md.read_text()
    case = next(c for s in JUnitXml.fromfile(str(junit)) if s.name == "fleetctl report: drift"
                for c in s)
    assert not case.is_passed and [type(r) for r in case.result] == [Skipped]
    assert "TOK_A" in case.result[0].message

"""A check that could not run is never called fine, in any format.

The property test drives every combination of check outcomes per host (ok, findings, could
not run, could not run but found something offline; for tokens also nothing to check) through
the library and all five formats (JSON, text, Markdown, JUnit, HTML), and checks each cell and
test case against an expectation computed here: a check did not run when it said so, and the
token audit (measured offline, from the blueprint) did not run for a host when drift could not
read that host. The CLI test does the same on a fleet with a host that refuses connections and
one that accepts and never answers (a timeout), each with an agent: their tokens column once
said ``ok``.

Found elsewhere first (the ``issues`` corpus): JUnit readers that show a ``skipped`` case as
passed (azure-pipelines-tasks#470, test-results-reporter/parser#70), Ansible's recap showing
an unreachable host beside ``ok`` counts (ansible#78986): so here a check that could not run is
a JUnit ``error``, and a check that ran in part a ``skipped`` whose message names what was not
checked, never a case with no result.
"""

from __future__ import annotations

import json
import re
import socket
from html.parser import HTMLParser

from hypothesis import given, settings
from hypothesis import strategies as st
from junitparser import Error, JUnitXml, Skipped

from fleetctl import nightly
from fleetctl.cli.output import nightly as render
from tests.commands.test_credentials import host_root  # noqa: F401 - the secrets fixture
from tests.commands.test_report import make_fleet, md_cells
from tests.helpers import cli

CHECKS = ("drift", "creds", "tokens")
OUTCOMES = ("ok", "findings", "cannot", "cannot+findings")
KIND = {"drift": "hand-patch", "creds": "readable-by-others", "tokens": "budget_tokens"}
PREVIOUS = "2026-11-30T02:00:00Z"
TONIGHT = "2026-12-01T02:00:00Z"


def did_not_run(plan: list[dict[str, str]], i: int, check: str) -> bool:
    """The expectation, from the plan alone: the check said it could not run, or it is the
    token audit of a host with agents that drift could not read."""
    p = plan[i]
    return p[check].startswith("cannot") or (
        check == "tokens" and p["tokens"] != "nothing" and p["drift"].startswith("cannot"))


def build(plan: list[dict[str, str]]) -> dict:
    """The document of a night with ``plan``'s outcomes, compared with a previous night that
    had one finding per host and check (each gone tonight)."""
    checks, findings, before = [], [], []
    for i, p in enumerate(plan):
        h = f"h{i}"
        for c in CHECKS:
            o = p[c]
            if o.startswith("cannot"):
                checks.append(nightly.CheckResult(h, c, "error", f"reason{i}{c}"))
            elif o == "nothing":
                checks.append(nightly.CheckResult(h, c, "skipped"))
            else:
                checks.append(nightly.CheckResult(h, c, o))
            if o.endswith("findings"):
                findings.append(nightly.Finding(c, h, KIND[c], f"tonight-{c}", f"{c} on {h}"))
            before.append({"check": c, "host": h, "kind": KIND[c], "subject": f"old-{c}",
                           "message": "old", "state": "new", "since": PREVIOUS, "nights": 1})
    report = nightly.NightlyReport(
        generated=TONIGHT, source=None,
        hosts=[{"host": f"h{i}", "status": "error" if p["drift"].startswith("cannot") else
                "in-sync", "release": None, "commit": None, "identity": None,
                "ancestry": None, "ship_in_progress": None, "unchecked_grants": []}
               for i, p in enumerate(plan)],
        checks=nightly.settle_checks(checks), findings=findings)
    nightly.judge(report, {"generated": PREVIOUS, "findings": before}, None,
                  nightly.parse_fail_on("all"))
    return nightly.report_document(report)


class Cells(HTMLParser):
    """``(host, check) -> (class, text, title)`` of the HTML overview's cells."""

    def __init__(self, page: str) -> None:
        super().__init__()
        self.cells: dict[tuple[str, str], list] = {}
        self._host: str | None = None
        self._cell: list | None = None
        self.feed(page)

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if tag == "tr" and "data-host" in a and "data-kind" not in a:
            self._host = a["data-host"]
        elif tag == "td" and self._host is not None and "data-check" in a:
            self._cell = [a.get("class"), "", a.get("title") or ""]
            self.cells[(self._host, a["data-check"])] = self._cell

    def handle_endtag(self, tag):
        if tag == "td":
            self._cell = None
        elif tag == "tr":
            self._host = None

    def handle_data(self, data):
        if self._cell is not None:
            self._cell[1] += data


PLAN = st.lists(st.fixed_dictionaries({"drift": st.sampled_from(OUTCOMES),
                                       "creds": st.sampled_from(OUTCOMES),
                                       "tokens": st.sampled_from(OUTCOMES + ("nothing",))}),
                min_size=1, max_size=4)


@settings(max_examples=150, deadline=None)
@given(plan=PLAN)
def test_property_no_format_calls_a_check_that_did_not_run_passing(plan):
    doc = build(plan)
    text = render.to_text(doc)
    md = render.to_markdown(doc)
    xml = JUnitXml.fromstring(render.to_junit(doc).encode())
    cases = {(suite.name.rsplit(" ", 1)[-1], case.name): case for suite in xml for case in suite}
    cells = Cells(render.to_html(doc)).cells
    checks = {(c["host"], c["check"]): c for c in doc["checks"]}
    states = {(f["host"], f["check"]): f["state"] for f in doc["findings"]
              if f["subject"].startswith("old-")}
    rows = {md_cells(line)[0].strip(): [x.strip() for x in md_cells(line)]
            for line in md.splitlines() if re.match(r"\| h\d+ \|", line)}
    host_lines = {line.split(":", 1)[0]: line for line in text.splitlines()
                  if re.match(r"h\d+: ", line)}
    assert doc["exit_code"] == (2 if any(did_not_run(plan, i, c) for i in range(len(plan))
                                         for c in CHECKS) else
                                1 if any(f["fails"] for f in doc["findings"]) else 0)
    for i, p in enumerate(plan):
        h = f"h{i}"
        for c in CHECKS:
            col = 1 + CHECKS.index(c)
            case = cases[(c, h)]
            cell_class, cell_text, cell_title = cells[(h, c)]
            if did_not_run(plan, i, c):
                reason = checks[(h, c)]["error"]
                assert checks[(h, c)]["status"] == "error" and reason, (h, c)
                assert f"{c}: ERROR" in host_lines[h] and f"  {c} error: {reason}" in text
                assert rows[h][col] == "ERROR" and f"**{h}: {c} could not run**" in md
                assert not case.is_passed and any(isinstance(r, (Error, Skipped))
                                                  for r in case.result), (h, c)
                assert "error" in cell_class.split() and cell_text != "ok"
                assert reason in cell_title
                assert states[(h, c)] == "unchecked", (h, c)  # never "resolved"
            elif p[c] == "nothing":
                assert checks[(h, c)]["status"] == "skipped" and rows[h][col] == "-"
                assert [type(r) for r in case.result] == [Skipped]
            else:
                assert checks[(h, c)]["status"] == p[c]
                assert f"{c}: {p[c]}" in host_lines[h] and rows[h][col] == p[c]
                assert cell_text == p[c] and p[c] in cell_class.split()
                assert states[(h, c)] == "resolved"
                assert case.is_passed == (p[c] == "ok"), (h, c)


def test_unreachable_and_timed_out_hosts_say_not_checked_in_every_format(tmp_path):
    """h1 is a local host with an agent; ``down`` refuses connections; ``mute`` accepts them
    and never sends a byte. Each has an agent whose prefix the blueprint measures offline:
    for the two hosts that could not be read, tokens is an error in JSON, text, Markdown,
    JUnit and HTML, naming why; h1's is ok."""
    mute = socket.socket()
    mute.bind(("127.0.0.1", 0))
    mute.listen(8)  # connections wait in the backlog: no banner, ever
    try:
        agents = {"w1": {"role": "worker"}}
        inv, bp = make_fleet(tmp_path, hosts=("h1",), agents=agents,
                             roles={"worker": {"prompt": "work"}})
        import yaml

        body = yaml.safe_load(inv.read_text())
        for name, port in (("down", 1), ("mute", mute.getsockname()[1])):
            body["hosts"][name] = {"transport": "ssh", "address": "127.0.0.1", "port": port,
                                   "user": "root", "root": "/srv/fleet", "agents": agents}
        inv.write_text(yaml.safe_dump(body))
        out = tmp_path / "out"
        out.mkdir()
        run = cli("report", "--format", "text", "--json", str(out / "r.json"), "--markdown",
                  str(out / "r.md"), "--junit", str(out / "r.xml"), "--html",
                  str(out / "r.html"), "--no-ledgers", "--timeout", "3", inventory=inv,
                  blueprint=bp)
        # With the runners' records read: the two hosts' ledgers and records are "not read",
        # never "no turns" or "nobody waits".
        read = cli("report", "--format", "json", "--markdown", str(out / "r2.md"), "--timeout",
                   "3", inventory=inv, blueprint=bp)
    finally:
        mute.close()
    assert run.code == 2, run.stdout + run.stderr
    doc = json.loads((out / "r.json").read_text())
    checks = {(c["host"], c["check"]): c for c in doc["checks"]}
    assert checks[("h1", "tokens")]["status"] == "ok"
    md = (out / "r.md").read_text()
    rows = {md_cells(line)[0].strip(): [x.strip() for x in md_cells(line)]
            for line in md.splitlines() if re.match(r"\| (h1|down|mute) \|", line)}
    xml = JUnitXml.fromfile(str(out / "r.xml"))
    cases = {(suite.name.rsplit(" ", 1)[-1], case.name): case for suite in xml for case in suite}
    cells = Cells((out / "r.html").read_text()).cells
    assert cases[("tokens", "h1")].is_passed and rows["h1"][3] == "ok"
    for host in ("down", "mute"):
        tokens = checks[(host, "tokens")]
        assert tokens["status"] == "error" and checks[(host, "drift")]["status"] == "error"
        assert tokens["error"].startswith("not checked: the host could not be read")
        line = next(x for x in run.stdout.splitlines() if x.startswith(f"{host}: "))
        assert "tokens: ERROR" in line and ": ok" not in line, line
        assert rows[host][3] == "ERROR"
        case = cases[("tokens", host)]
        assert not case.is_passed and [type(r) for r in case.result] == [Error]
        assert "not checked" in case.result[0].message
        cls, shown, title = cells[(host, "tokens")]
        assert "error" in cls.split() and shown == "ERROR" and "not checked" in title
        for check in ("drift", "creds"):
            assert checks[(host, check)]["status"] == "error" and checks[(host, check)]["error"]
            assert cases[(check, host)].is_passed is False
    assert read.code == 2, read.stdout + read.stderr
    runners = read.doc["runners"]
    assert {e["host"] for e in runners["errors"]} == {"down", "mute"}
    ledgers = {(a["host"], a["status"]) for a in read.doc["agents"]}
    assert ledgers == {("h1", "missing"), ("down", "host-error"), ("mute", "host-error")}
    summary = (out / "r2.md").read_text()
    for host in ("down", "mute"):
        assert f"- {host}: runner records not read: " in summary
        assert f"- {host}/w1: ledger not read (host-error)" in summary
    assert "### Agents that gave up or wait on a person" not in summary  # none of those read


def test_a_finding_on_a_part_not_checked_tonight_is_not_resolved():
    """Last night two drift findings on h0; tonight drift ran but could not check one
    credential file (its grant's secret missing): that finding is carried as unchecked, the
    other, checked and gone, is resolved."""
    before = [{"check": "drift", "host": "h0", "kind": "pending", "subject": s,
               "message": "old", "state": "new", "since": PREVIOUS, "nights": 1}
              for s in ("credentials/a/tok.env", "runner/a.txt")]
    report = nightly.NightlyReport(
        generated=TONIGHT, source=None, hosts=[],
        checks=[nightly.CheckResult("h0", "drift", "ok", not_checked=["a/tok: TOK_A missing"],
                                    unchecked_subjects=["credentials/a/tok.env"])],
        findings=[])
    nightly.judge(report, {"generated": PREVIOUS, "findings": before}, None,
                  nightly.parse_fail_on("all"))
    assert {f.subject: f.state for f in report.resolved} == {
        "credentials/a/tok.env": "unchecked", "runner/a.txt": "resolved"}


def test_a_rotated_secret_not_available_tonight_is_not_resolved(tmp_path, host_root,
                                                                real_users, monkeypatch):
    """Night 1: a grant's secret rotated since the ship, a pending finding on its credential
    file. Night 2: CI lacks that secret: the file is compared with the shipped record only,
    so the finding is unchecked (carried, seen since night 1), never resolved."""
    from tests.commands.test_credentials import Fleet, tok

    fleet = Fleet(tmp_path, host_root, real_users, monkeypatch)
    fleet.secret("TOK_A")
    fleet.configure(grants_a=tok("TOK_A"))
    assert fleet.run("ship", "--yes").code == 0
    fleet.secret("TOK_A")  # rotated: the blueprint now renders other bytes
    hist = tmp_path / "history"
    args = ("report", "--format", "json", "--no-ledgers", "--fail-on", "drift", "--history",
            str(hist))
    first = fleet.run(*args, "--now", PREVIOUS)
    assert [(f["subject"], f["state"]) for f in first.doc["findings"]
            if f["check"] == "drift"] == [("credentials/a/tok.env", "new")]
    monkeypatch.delenv("TOK_A")
    second = fleet.run(*args, "--now", TONIGHT)
    drift = [(f["subject"], f["state"], f["since"], f["fails"]) for f in second.doc["findings"]
             if f["check"] == "drift"]
    assert drift == [("credentials/a/tok.env", "unchecked", PREVIOUS, False)]
    assert second.doc["summary"]["resolved"] == 0

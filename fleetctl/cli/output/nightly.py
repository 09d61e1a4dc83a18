"""The nightly report's document (:func:`fleetctl.nightly.report_document`) rendered as text,
Markdown, JUnit XML and one self-contained HTML page.

Every renderer reads the same JSON document, so a night kept in ``--history`` renders the same
way later. Everything that came from a host (paths, names, messages) is escaped for the format it
lands in: :func:`fleetctl.names.printable` first (control characters and undecodable bytes become
visible escapes, which also keeps XML 1.0 valid), then HTML escaping for HTML and for Markdown
(whose renderers accept inline HTML), backslash escaping of Markdown's punctuation, and XML
escaping by the JUnit library. The HTML page loads nothing: its Content-Security-Policy forbids
every fetch, its styles, script and charts (SVG) are inline.
"""

from __future__ import annotations

import datetime as dt
import html
import json
from typing import Any

from fleetctl.cli.output.markdown import md_text
from fleetctl.names import printable, show_name
from fleetctl.nightly import unchecked_grant_text

MARKDOWN_LIMIT_BYTES = 1024 * 1024
"""GitHub's limit for one step's job summary: 1 MiB (1 048 576 bytes). The runner refuses a
larger ``$GITHUB_STEP_SUMMARY`` whole ("upload aborted, supports content up to a size of
1024k"), so the run's page shows nothing; the figure is ``AttachmentSizeLimit = 1024 * 1024`` in
actions/runner (pull request #1839, which raised it from 128 KiB) and "each step is restricted
to a maximum size of 1MiB" in GitHub's docs (workflow commands, "Step isolation and limits")."""
MARKDOWN_BUDGET_BYTES = MARKDOWN_LIMIT_BYTES // 2
"""What the summary may take by default: half the limit, so the workflow's own lines in the
same step, and GitHub's own accounting of the text, never bring it near 1 MiB."""
_MD_RESERVE_BYTES = 4096
"""Room kept inside the budget for the truncation note, the allowlist line and the closing
lines."""

_STATE_MARK = {"new": "NEW", "persisting": "persisting", "resolved": "resolved",
               "unchecked": "not checked"}
_CHECK_STATUS = {"ok": "ok", "findings": "findings", "error": "ERROR", "skipped": "-"}


def _checks_by_host(doc: dict[str, Any]) -> dict[str, dict[str, dict[str, Any]]]:
    out: dict[str, dict[str, dict[str, Any]]] = {}
    for c in doc["checks"]:
        out.setdefault(c["host"], {})[c["check"]] = c
    return out


def _host_names(doc: dict[str, Any]) -> list[str]:
    names = [h["host"] for h in doc["hosts"]]
    for c in doc["checks"]:
        if c["host"] not in names:
            names.append(c["host"])
    return names


def _since(f: dict[str, Any]) -> str:
    if f["state"] == "persisting":
        return f"since {(f['since'] or '?')[:10]}, {f['nights']} nights"
    if f["state"] in ("resolved", "unchecked"):
        return f"seen since {(f['since'] or '?')[:10]}"
    return "new tonight"


def _accept_note(f: dict[str, Any]) -> str:
    if f.get("accepted"):
        a = f["accepted"]
        return f"accepted until {a['expires']}: {a['reason']}"
    if f.get("expired"):
        a = f["expired"]
        return f"acceptance EXPIRED {a['expires']}: {a['reason']}"
    return ""


def _commit_text(h: dict[str, Any]) -> str:
    commit = (h.get("commit") or "")[:12] or "-"
    anc = h.get("ancestry") or {}
    rel = anc.get("relation")
    if rel == "behind":
        commit += f" (behind by {anc.get('behind')})"
    elif rel in ("diverged", "unknown"):
        commit += f" ({rel})"
    return commit


def check_cell(c: dict[str, Any] | None) -> str:
    """What a host's cell for one check says: ``ok``, ``findings``, ``ERROR``, ``-`` (nothing
    to check), and ``, N not checked`` after ``ok`` or ``findings`` when parts of the check
    could not run; never a plain ``ok`` for a check that did not run whole."""
    if c is None:
        return "-"
    text = _CHECK_STATUS.get(c["status"], c["status"])
    parts = c.get("not_checked") or []
    return f"{text}, {len(parts)} not checked" if parts and c["status"] in ("ok", "findings") \
        else text


def not_checked(doc: dict[str, Any], name: str) -> list[tuple[str, str]]:
    """``(check, line)`` per part of a check on host ``name`` that could not run. A night
    written before checks carried ``not_checked`` names drift's unchecked grants from the host."""
    out = []
    for c in doc["checks"]:
        if c["host"] == name:
            out += [(c["check"], printable(n)) for n in c.get("not_checked") or []]
    if not any("not_checked" in c for c in doc["checks"]):
        for h in doc["hosts"]:
            if h["host"] == name:
                out += [("drift", unchecked_grant_text(u)) for u in h.get("unchecked_grants")
                        or []]
    return out


def runners_not_read(doc: dict[str, Any]) -> list[str]:
    """One line per runner record or ledger that could not be read tonight (plain text)."""
    runners = doc.get("runners") or {}
    lines = [f"{e['host']}{'/' + e['agent'] if e.get('agent') else ''}: runner records not "
             f"read: {e['error']}" for e in runners.get("errors") or []]
    lines += [f"{a['host']}/{a['agent']}: ledger not read ({a['status']}): "
              f"{a.get('error') or ''}" for a in doc.get("agents") or []
              if a["status"] not in ("ok", "missing")]
    return [printable(line) for line in lines]


def waiting_on_people(doc: dict[str, Any]) -> list[str] | None:
    """One line per agent that gave up or waits on a person, or ``None`` when the runners'
    records were not read (``--no-ledgers``, or a night kept before they were): not known."""
    runners = doc.get("runners") or {}
    if not runners.get("read"):
        return None
    return [printable(_attention_text(a)) for a in runners.get("attention") or []]


def _attention_text(a: dict[str, Any]) -> str:
    """One agent that needs a person, for people."""
    what = []
    if a.get("last_task") and a.get("outcome") in ("gave-up", "denied", "refused"):
        what.append(f"last task {a['last_task']} {a['outcome']}"
                    + (f": {a['reason']}" if a.get("reason") else ""))
    if a.get("escalations_waiting"):
        what.append(f"{a['escalations_waiting']} escalation(s) waiting for a person"
                    + "".join(f"; {e.get('kind')} on task {e.get('task')}: {e.get('reason')}"
                              for e in a.get("escalations") or []))
    if a.get("standing_denials"):
        what.append(f"{a['standing_denials']} standing denial(s): no new task starts")
    return f"{a['host']}/{a['agent']} ({a['role']}): " + "; ".join(what)


def headline(doc: dict[str, Any]) -> str:
    """One line: the outcome, counts, and the exit code."""
    s = doc["summary"]
    verdict = {0: "clean", 1: "FINDINGS FAIL", 2: "ERRORS"}.get(doc["exit_code"], "?")
    return (f"fleetctl report {doc['generated']}: {verdict} (exit {doc['exit_code']}): "
            f"{s['hosts']} host(s), {s['findings']} finding(s) ({s['new']} new, "
            f"{s['persisting']} persisting, {s['resolved']} resolved, {s['accepted']} accepted), "
            f"{s['failing']} failing, {s['errors']} check error(s)")


# -- text ---------------------------------------------------------------------------------------


def to_text(doc: dict[str, Any], quiet: bool = False) -> str:
    """Plain lines for people: the headline, one line per host, the findings under each host,
    then the agents that need a person and the runner records not read.

    With ``quiet``, only what needs attention: failing findings, check errors, agents that
    need a person, records not read, expired acceptances (nothing at all when the run is
    clean). Lines are not padded to a width.
    """
    lines: list[str] = [] if quiet else [headline(doc)]
    if not quiet and doc.get("source"):
        src = doc["source"]
        lines.append(f"source: commit {(src.get('commit') or 'none')[:12]}"
                     + ("" if src.get("clean") else " (NOT CLEAN)"))
    checks = _checks_by_host(doc)
    for name in _host_names(doc):
        host: dict[str, Any] = next((h for h in doc["hosts"] if h["host"] == name),
                                    {"host": name})
        mine = [f for f in doc["findings"] if f["host"] == name]
        shown = [f for f in mine if f["fails"] or f.get("expired")] if quiet else mine
        errors = [c for c in checks.get(name, {}).values() if c["status"] == "error"]
        if quiet and not shown and not errors:
            continue
        states = ", ".join(f"{c}: {check_cell(checks[name][c])}"
                           for c in ("drift", "creds", "tokens") if c in checks.get(name, {}))
        lines.append(f"{show_name(name)}: {states}; release {host.get('release') or '-'}, "
                     f"commit {_commit_text(host)}")
        for c in errors:
            lines.append(f"  {c['check']} error: {printable(c['error'] or '')}"
                         + (f" (hint: {printable(c['hint'])})" if c.get("hint") else ""))
        if not quiet:
            lines += [f"  {check} unchecked: {text}" for check, text in not_checked(doc, name)]
        for f in shown:
            note = _accept_note(f)
            lines.append(f"  [{_STATE_MARK[f['state']]}{', FAILS' if f['fails'] else ''}] "
                         f"{f['check']} {f['kind']}: {printable(f['message'])} ({_since(f)})"
                         + (f"; {printable(note)}" if note else ""))
    waiting = waiting_on_people(doc)
    lines += [f"needs a person: {line}" for line in waiting or []]
    lines += [f"not checked: {line}" for line in runners_not_read(doc)]
    if waiting is None and not quiet:
        lines.append("agents that gave up or wait on a person: not known (runner records not "
                     "read)")
    if not quiet and doc.get("allowlist") and doc["allowlist"]["expired"]:
        lines.append(f"allowlist: {len(doc['allowlist']['expired'])} expired entr(y/ies)")
    return "\n".join(lines) + ("\n" if lines else "")


# -- markdown -----------------------------------------------------------------------------------

_MD_FINDINGS_HEAD = ["| fails | host | check | kind | path or rule | finding | history |",
                     "| --- | --- | --- | --- | --- | --- | --- |"]


def _md_findings_row(f: dict[str, Any]) -> str:
    fails = "**fails**" if f["fails"] else ("accepted" if f.get("accepted") else "")
    note = _accept_note(f)
    return (f"| {fails} | {md_text(f['host'])} | {f['check']} | {md_text(f['kind'])} | "
            f"{md_text(f['subject'])} | {md_text(f['message'])}"
            f"{' — ' + md_text(note) if note else ''} | {md_text(_since(f))} |")


def _size(lines: list[str]) -> int:
    """UTF-8 bytes of ``lines`` joined by newlines, each with its newline."""
    return sum(len(line.encode("utf-8")) + 1 for line in lines)


def _fit(items: list[Any], budget: int, line: Any = str) -> tuple[list[str], int]:
    """``line(item)`` for the first of ``items`` that fit in ``budget`` bytes, and how many
    items did not (lines are made only for what is kept)."""
    used, out = 0, list[str]()
    for i, item in enumerate(items):
        text = line(item)
        used += len(text.encode("utf-8")) + 1
        if used > budget:
            return out, len(items) - i
        out.append(text)
    return out, 0


def _attention_first(doc: dict[str, Any]) -> list[str]:
    """Host names, those with a check that did not run whole or a failing or new finding
    first, each group in report order."""
    names = _host_names(doc)
    bad = {c["host"] for c in doc["checks"] if c["status"] == "error" or c.get("not_checked")}
    bad |= {f["host"] for f in doc["findings"] if f["fails"] or f["state"] == "new"}
    return [n for n in names if n in bad] + [n for n in names if n not in bad]


def to_markdown(doc: dict[str, Any], budget_bytes: int = MARKDOWN_BUDGET_BYTES,
                elsewhere: tuple[str, ...] = ()) -> str:
    """A CI job summary that leads with what changed tonight: the headline; a table of hosts ×
    checks (hosts needing attention first); what could not be checked; the findings new
    tonight (failing first); the agents that gave up or wait on a person; then, collapsed, the
    persisting ones and those resolved or not checked tonight.

    The result is at most ``budget_bytes`` UTF-8 bytes (default :data:`MARKDOWN_BUDGET_BYTES`,
    half of GitHub's 1 MiB, :data:`MARKDOWN_LIMIT_BYTES`). When it does not fit, each part
    keeps what fits in order of importance (what could not be checked, then new findings,
    then the hosts' table, then persisting, then resolved), and a closing line says how many
    findings and hosts were left out and where every finding is: the files in ``elsewhere``
    (the report's other outputs of this run), or ``fleetctl report --format json``.
    """
    checks = _checks_by_host(doc)
    head = [f"## {md_text(headline(doc))}", ""]
    if doc.get("source"):
        src = doc["source"]
        head += [f"Blueprint commit `{(src.get('commit') or 'none')[:12]}`"
                 + ("" if src.get("clean") else " (**not clean**)")
                 + (f", compared with the night of {doc['previous']}" if doc.get("previous")
                    else ", no earlier night to compare with")
                 + f"; fails on: {md_text(', '.join(doc['fail_on']))}.", ""]
    records = {h["host"]: h for h in doc["hosts"]}
    tonight: dict[str, list[dict[str, Any]]] = {}
    carried: dict[str, int] = {}
    for f in doc["findings"]:
        if f["state"] not in ("resolved", "unchecked"):
            tonight.setdefault(f["host"], []).append(f)
        elif f["state"] == "unchecked":
            carried[f["host"]] = carried.get(f["host"], 0) + 1

    def host_row(name: str) -> str:
        host = records.get(name, {})
        mine = tonight.get(name, [])
        cells = [md_text(check_cell(checks.get(name, {}).get(c))) for c in ("drift", "creds",
                                                                           "tokens")]
        more = f" (+{carried[name]} not checked)" if carried.get(name) else ""
        return (f"| {md_text(name)} | {' | '.join(cells)} | "
                f"{md_text(host.get('release') or '-')} | {md_text(_commit_text(host))} | "
                f"{len(mine)}{more} | {sum(1 for f in mine if f['fails'])} | "
                f"{sum(1 for f in mine if f['state'] == 'new')} |")
    trouble = [f"- **{md_text(c['host'])}: {c['check']} could not run**: "
               f"{md_text(c['error'] or '')}"
               + (f" (hint: {md_text(c['hint'])})" if c.get("hint") else "")
               for c in doc["checks"] if c["status"] == "error"]
    trouble += [f"- {md_text(name)}: {check} unchecked: {md_text(text)}"
                for name in {c["host"]: 1 for c in doc["checks"] if c.get("not_checked")}
                for check, text in not_checked(doc, name)]
    trouble += [f"- {md_text(line)}" for line in runners_not_read(doc)]
    waiting = waiting_on_people(doc)
    people = (["", "### Agents that gave up or wait on a person: not known (runner records "
               "not read)"] if waiting is None else
              ["", f"### Agents that gave up or wait on a person: {len(waiting)}", ""]
              + [f"- {md_text(line)}" for line in waiting] if waiting else [])

    def rows(state: tuple[str, ...]) -> list[dict[str, Any]]:
        found = [f for f in doc["findings"] if f["state"] in state]
        return sorted(found, key=lambda f: (not f["fails"], {"high": 0, "medium": 1}.get(
            f["severity"], 2)))  # stable: report order within each rank

    new, persisting, gone = rows(("new",)), rows(("persisting",)), rows(("resolved",
                                                                         "unchecked"))
    left = budget_bytes - _MD_RESERVE_BYTES - _size(head)
    out = list(head)
    # What could not be checked and the hosts' table take at most a quarter each; the new
    # findings what is left, and the persisting and resolved ones whatever remains after them.
    table_head = ["| host | drift | creds | tokens | release | commit | findings | failing | new |",
                  "| --- | --- | --- | --- | --- | --- | ---: | ---: | ---: |"]
    quarter = max(0, left // 4)
    shown_trouble, lost_trouble = _fit(trouble, quarter)
    host_lines, lost_hosts = _fit(_attention_first(doc), max(0, quarter - _size(table_head)),
                                  host_row)
    people, lost_people = _fit(people, quarter)
    left -= _size(shown_trouble + table_head + host_lines + people)
    # Each kind of finding gets room only when every one before it fit: never an old row
    # where a new one was left out.
    new_lines, lost_new = _fit(new, max(0, left - 1024), _md_findings_row)
    left -= _size(new_lines)
    old_lines, lost_old = _fit(persisting, max(0, left - 512) if not lost_new else 0,
                               _md_findings_row)
    left -= _size(old_lines)
    gone_lines, lost_gone = _fit(gone, max(0, left - 512) if not lost_new + lost_old else 0,
                                 _md_findings_row)
    out += table_head + host_lines
    if lost_hosts:
        out.append(f"| … {lost_hosts} more host(s) | | | | | | | | |")
    if shown_trouble or lost_trouble:
        out += ["", "### Not checked", ""] + shown_trouble
        if lost_trouble:
            out.append(f"- … and {lost_trouble} more: see the full report")
    if new:
        out += ["", f"### New tonight: {len(new)} finding(s), "
                f"{sum(1 for f in new if f['fails'])} failing", ""]
        if new_lines:
            out += _MD_FINDINGS_HEAD + new_lines
    out += people
    if lost_people:
        out.append(f"- … and {lost_people} more: see the full report")
    for title, found, lines in ((f"Persisting: {len(persisting)} finding(s), "
                                 f"{sum(1 for f in persisting if f['fails'])} failing",
                                 persisting, old_lines),
                                (f"Resolved or not checked tonight: {len(gone)} finding(s)",
                                 gone, gone_lines)):
        if found:
            out += ["", f"<details><summary>{md_text(title)}</summary>", ""]
            if lines:
                out += _MD_FINDINGS_HEAD + lines
            out += ["", "</details>"]
    lost = lost_new + lost_old + lost_gone
    if lost or lost_hosts or lost_trouble:
        where = (", ".join(f"`{md_text(p)}`" for p in elsewhere) if elsewhere else
                 "the JSON document (`fleetctl report --format json`)")
        out += ["", f"**Truncated** to stay within {budget_bytes // 1024} KiB (GitHub takes "
                f"at most {MARKDOWN_LIMIT_BYTES // 1024 // 1024} MiB per step): {lost} of "
                f"{len(doc['findings'])} findings left out ({lost_new} new, {lost_old} "
                f"persisting, {lost_gone} resolved or not checked), {lost_hosts} host row(s) "
                f"and {lost_trouble} line(s) of what could not be checked. Every finding is in "
                f"{where}."]
    allow = doc.get("allowlist")
    if allow and allow.get("expired"):
        out += ["", f"Allowlist: {len(allow['expired'])} expired entr(y/ies): their findings "
                "fail again."]
    return "\n".join(out) + "\n"


# -- junit --------------------------------------------------------------------------------------


def to_junit(doc: dict[str, Any]) -> str:
    """JUnit XML written with ``junitparser``: one test suite per check, one test case per host
    (``classname`` ``fleetctl.CHECK``, ``name`` the host). A case fails when findings of it fail
    (the failure's ``type`` is the kinds, its text one line per finding), errors when the check
    could not run, is skipped when there was nothing to check or when parts of the check could
    not run (the skip's message names them): a check that did not run whole is never a passing
    case. Findings that do not fail (accepted, or outside ``--fail-on``) and the parts not
    checked are listed in its ``system-out``."""
    from junitparser import Error, Failure, JUnitXml, Skipped, TestCase, TestSuite
    from junitparser.junitparser import FinalResult

    xml = JUnitXml("fleetctl report")
    checks = _checks_by_host(doc)
    for check in ("drift", "creds", "tokens"):
        suite = TestSuite(f"fleetctl report: {check}")
        suite.timestamp = doc["generated"]
        for name in _host_names(doc):
            c = checks.get(name, {}).get(check)
            if c is None:
                continue
            case = TestCase(show_name(name), f"fleetctl.{check}", 0.0)
            mine = [f for f in doc["findings"] if f["host"] == name and f["check"] == check
                    and f["state"] not in ("resolved", "unchecked")]
            failing = [f for f in mine if f["fails"]]
            results: list[FinalResult] = []
            if c["status"] == "error":
                e = Error(printable(c["error"] or "the check could not run"), "check-error")
                e.text = printable(c.get("hint") or "")
                results.append(e)
            if failing:
                kinds = sorted({f["kind"] for f in failing})
                fail = Failure(f"{len(failing)} finding(s) fail: {', '.join(kinds)}",
                               ",".join(kinds))
                fail.text = "\n".join(f"[{f['state']}] {f['kind']}: {printable(f['message'])}"
                                      for f in failing) + "\n"
                results.append(fail)
            if c["status"] == "skipped":
                results.append(Skipped("nothing to check on this host"))
            parts = [printable(n) for n in c.get("not_checked") or []]
            if parts and not results:  # ran in part: not a pass, and never hidden
                results.append(Skipped(f"not checked: {'; '.join(parts)}"))
            case.result = results
            quiet = [f"[{f['state']}{', accepted' if f.get('accepted') else ''}] {f['kind']}: "
                     f"{printable(f['message'])}" for f in mine if not f["fails"]]
            quiet += [f"[not checked] {n}" for n in parts]
            if quiet:
                case.system_out = "\n".join(quiet) + "\n"
            suite.add_testcase(case)
        suite.update_statistics()
        xml.add_testsuite(suite)
    xml.update_statistics()
    import xml.etree.ElementTree as ET

    ET.indent(xml._elem)  # whitespace between elements only: failure texts are unchanged
    text = '<?xml version="1.0" encoding="UTF-8"?>\n' + ET.tostring(
        xml._elem, encoding="unicode") + "\n"
    # Read back before it is written: what a CI's JUnit reader gets must parse, with the same
    # number of cases.
    back = JUnitXml.fromstring(text.encode("utf-8"))
    if sum(1 for suite in back for _ in suite) != sum(1 for suite in xml for _ in suite):
        raise AssertionError("the JUnit XML did not read back whole")
    return text


# -- html ---------------------------------------------------------------------------------------

_PALETTE = ("#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b", "#e377c2",
            "#17becf", "#7f7f7f", "#bcbd22")

_CSS = """
body{font:14px/1.4 system-ui,sans-serif;margin:1.5em;color:#222}
h1{font-size:1.4em}h2{font-size:1.15em;margin-top:1.5em}
table{border-collapse:collapse;margin:.5em 0}
th,td{border:1px solid #ccc;padding:.25em .5em;text-align:left;vertical-align:top}
td.path{font-family:ui-monospace,monospace;word-break:break-all;max-width:40em}
.ok{background:#e6f4ea}.findings{background:#fff4d6}.error{background:#fde2e1}
.skipped{color:#888}.partial{background:#fff4d6;font-style:italic}.fails{font-weight:bold;color:#b00020}
tr[hidden]{display:none}#filters label{margin-right:1em}
figure{margin:.5em 0}svg text{font:11px system-ui,sans-serif}
svg text.axis-label{font-weight:bold}.chart-data{margin:.25em 0 1em}
#tonight{border-left:4px solid #b00020;padding-left:.75em}
"""

_JS = """
(function(){
  var rows=Array.prototype.slice.call(document.querySelectorAll('#findings-table tbody tr'));
  var form=document.getElementById('filters');
  function apply(){
    var want={};
    ['check','kind','state','host'].forEach(function(k){want[k]=form.elements[k].value;});
    var text=form.elements.text.value.toLowerCase();
    var failing=form.elements.failing.checked;
    var shown=0;
    rows.forEach(function(r){
      var ok=true;
      Object.keys(want).forEach(function(k){if(want[k]&&r.dataset[k]!==want[k])ok=false;});
      if(failing&&r.dataset.fails!=='1')ok=false;
      if(text&&r.textContent.toLowerCase().indexOf(text)<0)ok=false;
      r.hidden=!ok; if(ok)shown++;
    });
    document.getElementById('shown-count').textContent=shown+' of '+rows.length+' shown';
  }
  function fromHash(){
    var q=location.hash.replace(/^#/,'').split('&');
    q.forEach(function(p){
      var kv=p.split('='); if(kv.length!==2)return;
      var k=decodeURIComponent(kv[0]), v=decodeURIComponent(kv[1]);
      var el=form.elements[k]; if(!el)return;
      if(el.type==='checkbox')el.checked=(v==='1'); else el.value=v;
    });
  }
  form.addEventListener('submit',function(e){e.preventDefault();});
  form.addEventListener('input',apply);form.addEventListener('change',apply);
  window.addEventListener('hashchange',function(){fromHash();apply();});
  fromHash();apply();
  document.body.setAttribute('data-ready','1');
})();
"""


def _csp_hash(text: str) -> str:
    """A CSP source for an inline ``<style>`` or ``<script>`` with exactly ``text``."""
    import base64
    import hashlib

    return "sha256-" + base64.b64encode(hashlib.sha256(text.encode("utf-8")).digest()).decode()


def _e(text: Any) -> str:
    return html.escape(printable(str(text)), quote=True)


def _epoch(stamp: str) -> float | None:
    try:
        return dt.datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()
    except (ValueError, AttributeError):
        return None


def _chart_data(caption: str, head: list[str], rows: list[list[Any]], ident: str) -> str:
    """A chart's numbers as a table: the text alternative a reader or a screen reader uses."""
    return (f'<details class="chart-data" id="{ident}"><summary>{_e(caption)}</summary><table>'
            "<thead><tr>" + "".join(f'<th scope="col">{_e(h)}</th>' for h in head)
            + "</tr></thead><tbody>"
            + "".join("<tr>" + "".join(f"<td>{_e(c)}</td>" for c in r) + "</tr>" for r in rows)
            + "</tbody></table></details>")


def _svg_open(ident: str, width: int, height: int, title: str, desc: str) -> list[str]:
    """An accessible ``<svg>``: ``role="img"`` named by its ``<title>`` and ``<desc>``."""
    return [f'<svg xmlns="http://www.w3.org/2000/svg" id="{ident}" role="img" '
            f'aria-labelledby="{ident}-title {ident}-desc" width="{width}" height="{height}" '
            f'viewBox="0 0 {width} {height}">',
            f'<title id="{ident}-title">{_e(title)}</title>',
            f'<desc id="{ident}-desc">{_e(desc)}</desc>']


def _axes(width: int, height: int, pad_l: int, pad_b: int, pad_t: int, top: Any,
          x_label: str, y_label: str) -> list[str]:
    """Both axes, the y axis' 0 and top ticks, and a label on each axis."""
    base = height - pad_b
    return [f'<line class="axis" x1="{pad_l}" y1="{base}" x2="{width - 5}" y2="{base}" '
            'stroke="#888"/>',
            f'<line class="axis" x1="{pad_l}" y1="{pad_t}" x2="{pad_l}" y2="{base}" '
            'stroke="#888"/>',
            f'<text x="{pad_l - 5}" y="{pad_t + 10}" text-anchor="end">{_e(top)}</text>',
            f'<text x="{pad_l - 5}" y="{base}" text-anchor="end">0</text>',
            f'<text class="axis-label" data-axis="x" x="{(pad_l + width) // 2}" '
            f'y="{base + 28}" text-anchor="middle">{_e(x_label)}</text>',
            f'<text class="axis-label" data-axis="y" x="12" y="{(pad_t + base) // 2}" '
            f'text-anchor="middle" transform="rotate(-90 12 {(pad_t + base) // 2})">'
            f"{_e(y_label)}</text>"]


def _legend(x: int, y: int, entries: list[tuple[str, str]]) -> str:
    """A legend: a swatch and a name per series, one row each from ``(x, y)``."""
    return "".join(f'<g class="legend" data-series="{_e(name)}">'
                   f'<rect x="{x}" y="{y + 16 * i - 9}" width="10" height="10" fill="{colour}"/>'
                   f'<text x="{x + 14}" y="{y + 16 * i}" fill="{colour}">{_e(name)}</text></g>'
                   for i, (name, colour) in enumerate(entries))


def svg_findings_per_night(nights: list[dict[str, Any]], width: int = 640,
                           height: int = 230) -> str:
    """A bar per night (all findings), its failing part red; one ``<rect>`` per bar; labelled
    axes (night, findings), a legend, and a ``<desc>`` that says the numbers in words."""
    pad_l, pad_b, pad_t = 50, 60, 10
    n = max(1, len(nights))
    top = max([x["findings"] + x.get("unchecked", 0) for x in nights] + [1])
    bar_w = min(48.0, (width - pad_l - 10) / n)
    scale = (height - pad_b - pad_t) / top
    if nights:
        last = nights[-1]
        most = max(nights, key=lambda x: x["findings"])
        desc = (f"{len(nights)} night(s), {(nights[0]['generated'] or '')[:10]} to "
                f"{(last['generated'] or '')[:10]}. Tonight: {last['findings']} finding(s), "
                f"{last['failing']} failing, {last['new']} new"
                + (f", and {last['unchecked']} earlier finding(s) not checked (carried)"
                   if last.get("unchecked") else "")
                + f". Most: {most['findings']} on {(most['generated'] or '')[:10]}."
                + "".join(f" {x['generated'][:10]}: {x['unchecked']} not checked."
                          for x in nights[:-1] if x.get("unchecked") and x.get("generated")))
    else:
        desc = "No night kept yet."
    parts = _svg_open("chart-findings-svg", width, height, "Findings per night", desc)
    parts += _axes(width, height, pad_l, pad_b, pad_t, top, "night (UTC date)", "findings")
    for i, night in enumerate(nights):
        x = pad_l + i * bar_w + 2
        h_all = night["findings"] * scale
        h_fail = night["failing"] * scale
        h_unchecked = night.get("unchecked", 0) * scale
        label = _e(f"{night['generated']}: {night['findings']} finding(s), "
                   f"{night['failing']} failing, {night['new']} new"
                   + (f", {night['unchecked']} not checked" if night.get("unchecked") else ""))
        parts.append(f'<g class="night"><title>{label}</title>'
                     f'<rect class="bar-all" x="{x:.1f}" y="{height - pad_b - h_all:.1f}" '
                     f'width="{max(1.0, bar_w - 4):.1f}" height="{h_all:.1f}" fill="#6baed6"/>'
                     f'<rect class="bar-failing" x="{x:.1f}" y="{height - pad_b - h_fail:.1f}" '
                     f'width="{max(1.0, bar_w - 4):.1f}" height="{h_fail:.1f}" fill="#d62728"/>'
                     # Findings carried from an earlier night, not checked: grey, on top.
                     f'<rect class="bar-unchecked" x="{x:.1f}" '
                     f'y="{height - pad_b - h_all - h_unchecked:.1f}" '
                     f'width="{max(1.0, bar_w - 4):.1f}" height="{h_unchecked:.1f}" '
                     'fill="#bbbbbb"/></g>')
        if n <= 14 or i in (0, n - 1):
            parts.append(f'<text x="{x + bar_w / 2:.1f}" y="{height - pad_b + 14}" '
                         f'text-anchor="middle">{_e((night["generated"] or "")[5:10])}</text>')
    parts.append(_legend(width - 130, pad_t + 10, [("all findings", "#6baed6"),
                                                   ("failing", "#d62728"),
                                                   ("not checked", "#999999")]))
    parts.append("</svg>")
    return "".join(parts)


def svg_prefix_tokens(agents: list[dict[str, Any]], read: bool = True, width: int = 640,
                      height: int = 240) -> str:
    """One polyline per agent: prefix tokens per turn against time, from its ledger; labelled
    axes (time, tokens), a legend entry per agent, and a ``<desc>`` that names the agents whose
    ledger could not be read (never "no turns" for a ledger not read)."""
    series = [(a, [(t, v) for t, v in ((_epoch(p[0]), p[1]) for p in a["points"])
                   if t is not None]) for a in agents]
    series = [(a, pts) for a, pts in series if pts]
    unread = [a for a in agents if a["status"] not in ("ok", "missing")]
    pad_l, pad_b, pad_t = 60, 50, 10
    total_h = height + 16 * len(series)
    if not read:
        desc = "The runners' ledgers were not read (--no-ledgers): not known."
    elif series:
        desc = "; ".join(f"{a['host']}/{a['agent']}: {a['turns']} turn(s), median "
                         f"{a['median_prefix_tokens']}, last {a['last_prefix_tokens']} "
                         "prefix tokens per turn" for a, _ in series) + "."
    else:
        desc = "No ledger turns yet." if not unread else "No ledger turns read."
    if unread:
        desc += " Not read: " + "; ".join(f"{a['host']}/{a['agent']} ({a['status']}: "
                                          f"{a.get('error') or 'not read'})"
                                          for a in unread) + "."
    parts = _svg_open("chart-prefix-svg", width, total_h, "Prefix tokens per turn, per agent",
                      desc)
    if not series:
        parts.append(f'<text class="chart-empty" x="{pad_l}" y="{height // 2}">'
                     f"{_e(desc)}</text></svg>")
        return "".join(parts)
    t0 = min(p[0] for _, pts in series for p in pts)
    t1 = max(p[0] for _, pts in series for p in pts)
    top = max(p[1] for _, pts in series for p in pts) or 1
    span = (t1 - t0) or 1.0
    plot_w, plot_h = width - pad_l - 10, height - pad_b - pad_t
    parts += _axes(width, height, pad_l, pad_b, pad_t, top, "time of the turn (UTC)",
                   "prefix tokens per turn")
    for x, t in ((pad_l, t0), (width - 10, t1)):
        stamp = dt.datetime.fromtimestamp(t, dt.UTC).strftime("%m-%d %H:%M")
        parts.append(f'<text x="{x}" y="{height - pad_b + 14}" text-anchor="middle">'
                     f"{stamp}</text>")
    entries = []
    for i, (a, pts) in enumerate(series):
        color = _PALETTE[i % len(_PALETTE)]
        coords = " ".join(f"{pad_l + (t - t0) / span * plot_w:.1f},"
                          f"{height - pad_b - v / top * plot_h:.1f}" for t, v in pts)
        name = _e(f"{a['host']}/{a['agent']}")
        parts.append(f'<g class="agent-series"><title>{name}: {a["turns"]} turn(s), median '
                     f'{_e(a["median_prefix_tokens"])}</title>'
                     f'<polyline fill="none" stroke="{color}" stroke-width="1.5" '
                     f'points="{coords}"/></g>')
        entries.append((f"{a['host']}/{a['agent']} (median {a['median_prefix_tokens']} "
                        "tokens/turn)", color))
    parts.append(_legend(pad_l, height + 12, entries))
    parts.append("</svg>")
    return "".join(parts)


def _finding_cells(f: dict[str, Any], history: bool = True) -> str:
    """A finding's cells for the page's tables (the first links to its row in the table of
    every finding)."""
    fails = "fails" if f["fails"] else ("accepted" if f.get("accepted") else "")
    return (f'<td><a href="#f-{f["id"]}">{_e(fails or "see")}</a></td><td>{_e(f["host"])}</td>'
            f"<td>{_e(f['check'])}</td><td>{_e(f['kind'])}</td>"
            f'<td class="path">{_e(f["subject"])}</td><td>{_e(f["message"])}'
            + (f" — {_e(_accept_note(f))}" if _accept_note(f) else "") + "</td>"
            + (f"<td>{_e(_since(f))}</td>" if history else ""))


def _tonight(doc: dict[str, Any]) -> list[str]:
    """The page's first section: new findings, agents that gave up or wait on a person, and
    what could not be checked."""
    new = sorted((f for f in doc["findings"] if f["state"] == "new"),
                 key=lambda f: (not f["fails"], {"high": 0, "medium": 1}.get(f["severity"], 2)))
    p = ['<section id="tonight"><h2>Tonight</h2>',
         f'<h3 id="tonight-new">New findings: {len(new)}, '
         f'{sum(1 for f in new if f["fails"])} failing</h3>']
    if new:
        p.append('<table id="new-table"><thead><tr><th>fails</th><th>host</th><th>check</th>'
                 "<th>kind</th><th>path or rule</th><th>finding</th></tr></thead><tbody>"
                 + "".join(f'<tr data-new="{f["id"]}">{_finding_cells(f, history=False)}</tr>'
                           for f in new) + "</tbody></table>")
    else:
        p.append('<p id="no-new">No finding is new tonight.</p>')
    runners = doc.get("runners") or {"read": False, "attention": [], "errors": []}
    waiting = runners.get("attention") or []
    p.append(f'<h3 id="tonight-people">Agents that gave up or wait on a person: '
             f"{len(waiting) if runners.get('read') else 'not known'}</h3>")
    if not runners.get("read"):
        p.append('<p id="people-not-read">The runners\' records were not read '
                 "(<code>--no-ledgers</code>): whether an agent gave up or waits on a person "
                 "is not known.</p>")
    elif waiting:
        p.append('<ul id="people">' + "".join(
            f'<li data-agent="{_e(a["host"] + "/" + a["agent"])}">{_e(_attention_text(a))}</li>'
            for a in waiting) + "</ul>")
    else:
        p.append(f'<p id="no-people">None of the {runners.get("agents", 0)} agent(s) read '
                 "gave up or waits on a person.</p>")
    trouble = [f"{c['host']}: {c['check']} could not run: {c['error'] or ''}"
               + (f" (hint: {c['hint']})" if c.get("hint") else "")
               for c in doc["checks"] if c["status"] == "error"]
    trouble += [f"{name}: {check} not checked: {text}" for name in _host_names(doc)
                for check, text in not_checked(doc, name)]
    trouble += runners_not_read(doc)
    if trouble:
        p.append(f'<h3 id="tonight-unchecked">Not checked: {len(trouble)}</h3>'
                 '<ul id="not-checked">' + "".join(f"<li>{_e(t)}</li>" for t in trouble)
                 + "</ul>")
    p.append("</section>")
    return p


def to_html(doc: dict[str, Any]) -> str:
    """One self-contained page that leads with what changed tonight: the new findings, the
    agents that gave up or wait on a person and what could not be checked; then what persists;
    then the fleet overview (hosts × checks), the charts (findings per night; each agent's
    prefix tokens per turn) as inline SVG, each with labelled axes, a legend, a ``<title>`` and
    ``<desc>`` and its numbers in a table, and every finding with filters (check, kind, state,
    host, text, failing only; also from the URL's ``#kind=...&state=...``).

    The page fetches nothing (its CSP says ``default-src 'none'``), runs only its own style
    and script (allowed by their sha256 in the CSP, not ``unsafe-inline``), and marks ``<body
    data-ready="1">`` when its script has run.
    """
    checks = _checks_by_host(doc)
    # Only this page's own style and script may run, named by their digests: even a host's
    # text that escaped escaping could not add a script, a handler or a fetch.
    csp = (f"default-src 'none'; style-src '{_csp_hash(_CSS)}'; "
           f"script-src '{_csp_hash(_JS)}'; img-src data:")
    p = [f'<!DOCTYPE html><html lang="en"><head><meta charset="utf-8">'
         f'<meta http-equiv="Content-Security-Policy" content="{csp}">'
         f'<meta name="viewport" content="width=device-width, initial-scale=1">'
         f"<title>fleetctl report {_e(doc['generated'])}</title><style>{_CSS}</style></head>"
         f'<body data-exit-code="{doc["exit_code"]}">',
         f'<h1>fleetctl report</h1><p id="headline">{_e(headline(doc))}</p>']
    if doc.get("source"):
        src = doc["source"]
        p.append(f'<p id="source">blueprint commit <code>{_e(src.get("commit") or "none")}'
                 f'</code>{"" if src.get("clean") else " (not clean)"}; fails on '
                 f'{_e(", ".join(doc["fail_on"]))}</p>')
    p += _tonight(doc)
    persisting = sorted((f for f in doc["findings"] if f["state"] == "persisting"),
                        key=lambda f: (not f["fails"], -int(f.get("nights") or 1)))
    p.append(f'<section id="persisting"><h2>Persisting: {len(persisting)}, '
             f'{sum(1 for f in persisting if f["fails"])} failing</h2>')
    if persisting:
        p.append('<table id="persisting-table"><thead><tr><th>fails</th><th>host</th>'
                 "<th>check</th><th>kind</th><th>path or rule</th><th>finding</th>"
                 "<th>history</th></tr></thead><tbody>"
                 + "".join(f'<tr data-persisting="{f["id"]}">{_finding_cells(f)}</tr>'
                           for f in persisting) + "</tbody></table>")
    else:
        p.append('<p id="no-persisting">No finding persists from an earlier night.</p>')
    p.append("</section>")
    p.append('<section id="overview"><h2>Fleet</h2><table id="overview-table"><thead><tr>'
             "<th>host</th><th>drift</th><th>creds</th><th>tokens</th><th>release</th>"
             "<th>commit</th><th>findings</th><th>failing</th></tr></thead><tbody>")
    for name in _host_names(doc):
        host: dict[str, Any] = next((h for h in doc["hosts"] if h["host"] == name), {})
        mine = [f for f in doc["findings"] if f["host"] == name
                and f["state"] not in ("resolved", "unchecked")]
        carried = sum(1 for f in doc["findings"] if f["host"] == name
                      and f["state"] == "unchecked")
        cells = []
        for c in ("drift", "creds", "tokens"):
            r = checks.get(name, {}).get(c)
            status = r["status"] if r else "skipped"
            parts = (r.get("not_checked") or []) if r else []
            why = "; ".join(([r["error"]] if r and r.get("error") else []) + parts)
            tip = f' title="{_e(why)}"' if why else ""
            partial = " partial" if parts and status in ("ok", "findings") else ""
            cells.append(f'<td class="check {status}{partial}" data-check="{c}"{tip}>'
                         f"{_e(check_cell(r))}</td>")
        p.append(f'<tr data-host="{_e(name)}"><th scope="row">{_e(name)}</th>{"".join(cells)}'
                 f"<td>{_e(host.get('release') or '-')}</td><td>{_e(_commit_text(host))}</td>"
                 f"<td>{len(mine)}{f' (+{carried} not checked)' if carried else ''}</td>"
                 f"<td>{sum(1 for f in mine if f['fails'])}</td></tr>")
    p.append("</tbody></table></section>")
    runners = doc.get("runners") or {"read": bool(doc.get("agents"))}
    p.append('<section id="charts"><h2>Over time</h2>'
             '<figure id="chart-findings"><figcaption>Findings per night (blue: all '
             "findings; red: the failing part; grey: earlier findings that night could not "
             "check), from the nights kept in --history"
             f"</figcaption>{svg_findings_per_night(doc['nights'])}"
             + _chart_data("Findings per night, as numbers", ["night", "findings", "failing",
                                                             "new", "not checked"],
                           [[n["generated"], n["findings"], n["failing"], n["new"],
                             n.get("unchecked", 0)] for n in doc["nights"]],
                           "chart-findings-data")
             + "</figure>"
             '<figure id="chart-prefix"><figcaption>Prefix tokens per turn, per agent (from '
             "the runners' ledgers)</figcaption>"
             f"{svg_prefix_tokens(doc['agents'], bool(runners.get('read')))}"
             + _chart_data("Prefix tokens per turn, as numbers",
                           ["agent", "ledger", "turns", "median", "last", "why not read"],
                           [[f"{a['host']}/{a['agent']}", a["status"], a["turns"],
                             a["median_prefix_tokens"], a["last_prefix_tokens"],
                             a.get("error") or ""] for a in doc["agents"]],
                           "chart-prefix-data")
             + "</figure></section>")

    def options(name: str, values: list[str]) -> str:
        opts = "".join(f'<option value="{_e(v)}">{_e(v)}</option>' for v in values)
        return (f'<label>{name} <select name="{name}"><option value="">all</option>{opts}'
                "</select></label>")

    found = doc["findings"]
    p.append('<section id="findings"><h2>Every finding</h2><form id="filters">'
             + options("check", sorted({f["check"] for f in found}))
             + options("kind", sorted({f["kind"] for f in found}))
             + options("state", sorted({f["state"] for f in found}))
             + options("host", _host_names(doc))
             + '<label>text <input name="text" type="search"></label>'
             '<label><input name="failing" type="checkbox" value="1"> failing only</label></form>'
             '<p id="shown-count"></p><table id="findings-table"><thead><tr><th>state</th>'
             "<th>host</th><th>check</th><th>kind</th><th>path or rule</th><th>finding</th>"
             "<th>history</th><th>accepted</th></tr></thead><tbody>")
    for f in found:
        p.append(f'<tr id="f-{f["id"]}" data-check="{_e(f["check"])}" data-kind="{_e(f["kind"])}"'
                 f' data-state="{_e(f["state"])}" data-host="{_e(f["host"])}" '
                 f'data-fails="{1 if f["fails"] else 0}"{" class=fails" if f["fails"] else ""}>'
                 f"<td>{_e(_STATE_MARK[f['state']])}</td><td>{_e(f['host'])}</td>"
                 f"<td>{_e(f['check'])}</td><td>{_e(f['kind'])}</td>"
                 f'<td class="path">{_e(f["subject"])}</td><td>{_e(f["message"])}</td>'
                 f"<td>{_e(_since(f))}</td><td>{_e(_accept_note(f))}</td></tr>")
    p.append("</tbody></table></section>")
    p.append(f"<script>{_JS}</script></body></html>")
    return "".join(p) + "\n"


def to_json(doc: dict[str, Any]) -> str:
    """The document as JSON text (UTF-8, indented, a final newline)."""
    return json.dumps(doc, indent=2, ensure_ascii=False) + "\n"


def failure_document(fmt: str, message: str, generated: str) -> str:
    """What an output file holds when the run failed before it could report (bad inventory,
    unknown host, bad allowlist): the error, in that format, so last night's file is never
    left in place to be published as tonight's."""
    doc = {"schema_version": 1, "command": "report", "generated": generated, "exit_code": 2,
           "error": printable(message)}
    if fmt == "json":
        return to_json(doc)
    if fmt == "markdown":
        return f"## fleetctl report {generated}: FAILED (exit 2)\n\n{md_text(message)}\n"
    if fmt == "junit":
        import xml.etree.ElementTree as ET

        from junitparser import Error, JUnitXml, TestCase, TestSuite

        xml = JUnitXml("fleetctl report")
        suite = TestSuite("fleetctl report")
        case = TestCase("report", "fleetctl.report", 0.0)
        case.result = [Error(printable(message), "report-error")]
        suite.add_testcase(case)
        suite.update_statistics()
        xml.add_testsuite(suite)
        xml.update_statistics()
        return '<?xml version="1.0" encoding="UTF-8"?>\n' + ET.tostring(
            xml._elem, encoding="unicode") + "\n"
    if fmt == "html":
        return (f'<!DOCTYPE html><html lang="en"><head><meta charset="utf-8"><title>fleetctl '
                f"report failed</title></head><body><h1>fleetctl report {_e(generated)}: failed"
                f'</h1><p id="error">{_e(message)}</p></body></html>\n')
    return f"fleetctl report {generated}: FAILED: {printable(message)}\n"

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
from fleetctl.names import printable
from fleetctl.nightly import unchecked_grant_text

MARKDOWN_LIMIT_BYTES = 1024 * 1024
"""GitHub's limit for one step's job summary (1 MiB); the Markdown stays under it."""
_MD_RESERVE_BYTES = 4096
"""Room kept for the truncation note and the closing lines."""

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
    """Plain lines for people: the headline, one line per host, the findings under each host.

    With ``quiet``, only what needs attention: failing findings, check errors, expired
    acceptances (nothing at all when the run is clean). Lines are not padded to a width.
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
        lines.append(f"{printable(name)}: {states}; release {host.get('release') or '-'}, "
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
    if not quiet and doc.get("allowlist") and doc["allowlist"]["expired"]:
        lines.append(f"allowlist: {len(doc['allowlist']['expired'])} expired entr(y/ies)")
    return "\n".join(lines) + ("\n" if lines else "")


# -- markdown -----------------------------------------------------------------------------------

def _md_findings_row(f: dict[str, Any]) -> str:
    fails = "**fails**" if f["fails"] else ("accepted" if f.get("accepted") else "")
    note = _accept_note(f)
    return (f"| {_STATE_MARK[f['state']]} | {fails} | {f['check']} | {md_text(f['kind'])} | "
            f"{md_text(f['subject'])} | {md_text(f['message'])}"
            f"{' — ' + md_text(note) if note else ''} | {md_text(_since(f))} |")


def to_markdown(doc: dict[str, Any], limit_bytes: int = MARKDOWN_LIMIT_BYTES) -> str:
    """A CI job summary: the headline, a table of hosts × checks, then per host a headline and
    its findings in a collapsed ``<details>`` block.

    The result is at most ``limit_bytes`` UTF-8 bytes (default 1 MiB, GitHub's summary limit):
    when the findings do not fit, the rows that fit are kept and a note says how many were left
    out and where the whole report is (the JSON, JUnit and HTML files).
    """
    checks = _checks_by_host(doc)
    out = [f"## {md_text(headline(doc))}", ""]
    if doc.get("source"):
        src = doc["source"]
        out += [f"Blueprint commit `{(src.get('commit') or 'none')[:12]}`"
                + ("" if src.get("clean") else " (**not clean**)")
                + (f", compared with the night of {doc['previous']}" if doc.get("previous")
                   else ", no earlier night to compare with")
                + f"; fails on: {md_text(', '.join(doc['fail_on']))}.", ""]
    out += ["| host | drift | creds | tokens | release | commit | findings | failing | new |",
            "| --- | --- | --- | --- | --- | --- | ---: | ---: | ---: |"]
    for name in _host_names(doc):
        host: dict[str, Any] = next((h for h in doc["hosts"] if h["host"] == name), {})
        mine = [f for f in doc["findings"] if f["host"] == name
                and f["state"] not in ("resolved", "unchecked")]
        cells = [md_text(check_cell(checks.get(name, {}).get(c))) for c in ("drift", "creds",
                                                                           "tokens")]
        out.append(f"| {md_text(name)} | {' | '.join(cells)} | "
                   f"{md_text(host.get('release') or '-')} | {md_text(_commit_text(host))} | "
                   f"{len(mine)} | {sum(1 for f in mine if f['fails'])} | "
                   f"{sum(1 for f in mine if f['state'] == 'new')} |")
    budget = limit_bytes - _MD_RESERVE_BYTES
    total = len(doc["findings"])
    unchecked = {name: not_checked(doc, name) for name in _host_names(doc)}
    blocks = []
    for name in _host_names(doc):
        mine = [f for f in doc["findings"] if f["host"] == name]
        errors = [c for c in checks.get(name, {}).values() if c["status"] == "error"]
        if not mine and not errors and not unchecked.get(name):
            continue
        failing = sum(1 for f in mine if f["fails"])
        new = sum(1 for f in mine if f["state"] == "new")
        gone = sum(1 for f in mine if f["state"] == "resolved")
        head = ["", f"### {'❌' if failing or errors else '✅'} {md_text(name)}: "
                f"{len(mine) - gone} finding(s), {new} new, {gone} resolved, {failing} failing",
                ""]
        head += [f"- **{c['check']} could not run**: {md_text(c['error'] or '')}"
                 + (f" (hint: {md_text(c['hint'])})" if c.get("hint") else "") for c in errors]
        head += [f"- {check} unchecked: {md_text(text)}" for check, text in unchecked[name]]
        blocks.append((head, mine))
    # Every host's headline is kept; the rows share what is left, host by host, a host's
    # unused share going to the next.
    size = len("\n".join(out).encode("utf-8")) + sum(
        len("\n".join(head).encode("utf-8")) + 1 for head, _ in blocks)
    opening = ["<details><summary>findings</summary>", "",
               "| state | fails | check | kind | path or rule | finding | history |",
               "| --- | --- | --- | --- | --- | --- | --- |"]
    frame = len("\n".join(opening + ["", "</details>"]).encode("utf-8")) + 2
    dropped = 0
    while blocks and size > budget:  # a fleet so large its headlines alone do not fit
        head, mine = blocks.pop()
        size -= len("\n".join(head).encode("utf-8")) + 1
        dropped += 1
    while len("\n".join(out).encode("utf-8")) > budget and len(out) > 4:
        out.pop()  # ... nor its overview table
        dropped += 1
    left = budget - size
    shown = 0
    cut = False
    with_rows = sum(1 for _, mine in blocks if mine)
    for head, mine in blocks:
        out += head
        if not mine:
            continue
        share = left // max(1, with_rows)
        with_rows -= 1
        used = frame
        rows = []
        for f in mine:
            row = _md_findings_row(f)
            n = len(row.encode("utf-8")) + 1
            if used + n > share:
                cut = True
                break
            rows.append(row)
            used += n
        if rows:  # else the headline's counts stand alone
            out += opening + rows + ["", "</details>"]
            left -= used
        shown += len(rows)
    if cut or dropped:
        out += ["", f"**Truncated**: {shown} of {total} findings shown, to stay under the "
                f"{limit_bytes / 1024 / 1024:g} MiB job-summary limit. Every finding is in the "
                "JSON, JUnit and HTML reports."]
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
            case = TestCase(printable(name), f"fleetctl.{check}", 0.0)
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


def svg_findings_per_night(nights: list[dict[str, Any]], width: int = 640,
                           height: int = 200) -> str:
    """A bar per night (all findings), its failing part darker; one ``<rect>`` per bar."""
    pad_l, pad_b, pad_t = 40, 30, 10
    n = max(1, len(nights))
    top = max([x["findings"] for x in nights] + [1])
    bar_w = min(48.0, (width - pad_l - 10) / n)
    scale = (height - pad_b - pad_t) / top
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" id="chart-findings-svg" role="img" '
             f'width="{width}" height="{height}" viewBox="0 0 {width} {height}">',
             "<title>findings per night</title>",
             f'<line x1="{pad_l}" y1="{height - pad_b}" x2="{width - 5}" y2="{height - pad_b}" '
             'stroke="#888"/>',
             f'<text x="{pad_l - 5}" y="{pad_t + 10}" text-anchor="end">{top}</text>',
             f'<text x="{pad_l - 5}" y="{height - pad_b}" text-anchor="end">0</text>']
    for i, night in enumerate(nights):
        x = pad_l + i * bar_w + 2
        h_all = night["findings"] * scale
        h_fail = night["failing"] * scale
        label = _e(f"{night['generated']}: {night['findings']} finding(s), "
                   f"{night['failing']} failing, {night['new']} new")
        parts.append(f'<g class="night"><title>{label}</title>'
                     f'<rect class="bar-all" x="{x:.1f}" y="{height - pad_b - h_all:.1f}" '
                     f'width="{max(1.0, bar_w - 4):.1f}" height="{h_all:.1f}" fill="#9ecae1"/>'
                     f'<rect class="bar-failing" x="{x:.1f}" y="{height - pad_b - h_fail:.1f}" '
                     f'width="{max(1.0, bar_w - 4):.1f}" height="{h_fail:.1f}" fill="#d62728"/>'
                     "</g>")
        if n <= 14 or i in (0, n - 1):
            parts.append(f'<text x="{x + bar_w / 2:.1f}" y="{height - pad_b + 14}" '
                         f'text-anchor="middle">{_e((night["generated"] or "")[5:10])}</text>')
    parts.append("</svg>")
    return "".join(parts)


def svg_prefix_tokens(agents: list[dict[str, Any]], width: int = 640, height: int = 220) -> str:
    """One polyline per agent: prefix tokens per turn against time, from its ledger."""
    series = [(a, [(t, v) for t, v in ((_epoch(p[0]), p[1]) for p in a["points"])
                   if t is not None]) for a in agents]
    series = [(a, pts) for a, pts in series if pts]
    pad_l, pad_b, pad_t = 50, 30, 10
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" id="chart-prefix-svg" role="img" '
             f'width="{width}" height="{height + 16 * len(series)}" '
             f'viewBox="0 0 {width} {height + 16 * len(series)}">',
             "<title>prefix tokens per turn, per agent</title>"]
    if not series:
        parts.append(f'<text x="{pad_l}" y="{height // 2}">no ledger turns yet</text></svg>')
        return "".join(parts)
    t0 = min(p[0] for _, pts in series for p in pts)
    t1 = max(p[0] for _, pts in series for p in pts)
    top = max(p[1] for _, pts in series for p in pts) or 1
    span = (t1 - t0) or 1.0
    plot_w, plot_h = width - pad_l - 10, height - pad_b - pad_t
    parts += [f'<line x1="{pad_l}" y1="{height - pad_b}" x2="{width - 5}" y2="{height - pad_b}" '
              'stroke="#888"/>',
              f'<text x="{pad_l - 5}" y="{pad_t + 10}" text-anchor="end">{top}</text>',
              f'<text x="{pad_l - 5}" y="{height - pad_b}" text-anchor="end">0</text>']
    for i, (a, pts) in enumerate(series):
        color = _PALETTE[i % len(_PALETTE)]
        coords = " ".join(f"{pad_l + (t - t0) / span * plot_w:.1f},"
                          f"{height - pad_b - v / top * plot_h:.1f}" for t, v in pts)
        name = _e(f"{a['host']}/{a['agent']}")
        parts.append(f'<g class="agent-series"><title>{name}: {a["turns"]} turn(s), median '
                     f'{_e(a["median_prefix_tokens"])}</title>'
                     f'<polyline fill="none" stroke="{color}" stroke-width="1.5" '
                     f'points="{coords}"/></g>')
        parts.append(f'<text x="{pad_l}" y="{height + 12 + 16 * i}" fill="{color}">{name} '
                     f'(median {_e(a["median_prefix_tokens"])} tokens/turn)</text>')
    parts.append("</svg>")
    return "".join(parts)


def to_html(doc: dict[str, Any]) -> str:
    """One self-contained page: the fleet overview (hosts × checks), the charts (findings per
    night; each agent's prefix tokens per turn) as inline SVG, and the findings with filters
    (check, kind, state, host, text, failing only; also from the URL's ``#kind=...&state=...``).

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
    p.append('<section id="overview"><h2>Fleet</h2><table id="overview-table"><thead><tr>'
             "<th>host</th><th>drift</th><th>creds</th><th>tokens</th><th>release</th>"
             "<th>commit</th><th>findings</th><th>failing</th></tr></thead><tbody>")
    for name in _host_names(doc):
        host: dict[str, Any] = next((h for h in doc["hosts"] if h["host"] == name), {})
        mine = [f for f in doc["findings"] if f["host"] == name
                and f["state"] not in ("resolved", "unchecked")]
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
                 f"<td>{len(mine)}</td><td>{sum(1 for f in mine if f['fails'])}</td></tr>")
    p.append("</tbody></table></section>")
    p.append('<section id="charts"><h2>Over time</h2>'
             '<figure id="chart-findings"><figcaption>Findings per night (red: failing)'
             f"</figcaption>{svg_findings_per_night(doc['nights'])}</figure>"
             '<figure id="chart-prefix"><figcaption>Prefix tokens per turn, per agent (from '
             f"the runners' ledgers)</figcaption>{svg_prefix_tokens(doc['agents'])}</figure>"
             "</section>")

    def options(name: str, values: list[str]) -> str:
        opts = "".join(f'<option value="{_e(v)}">{_e(v)}</option>' for v in values)
        return (f'<label>{name} <select name="{name}"><option value="">all</option>{opts}'
                "</select></label>")

    found = doc["findings"]
    p.append('<section id="findings"><h2>Findings</h2><form id="filters">'
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
    unchecked = [(name, check, text) for name in _host_names(doc)
                 for check, text in not_checked(doc, name)]
    if unchecked:
        p.append('<section id="unchecked"><h2>Not checked (parts of a check that could not '
                 'run)</h2><ul>' + "".join(f"<li>{_e(host)}: {_e(check)}: {_e(text)}</li>"
                                         for host, check, text in unchecked) + "</ul></section>")
    errors = [c for c in doc["checks"] if c["status"] == "error"]
    if errors:
        p.append('<section id="errors"><h2>Checks that could not run</h2><ul>'
                 + "".join(f"<li>{_e(c['host'])}: {_e(c['check'])}: {_e(c['error'] or '')}</li>"
                           for c in errors) + "</ul></section>")
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

"""The allowlist's ``expires``: every way YAML can read a date wrong stops the run with the file,
the line of the key and the key, exit 2, no traceback, no night kept.

PyYAML reads an unquoted ``2026-12-01`` as a ``datetime.date``, ``2026-12-01T10:00:00`` as a
``datetime`` (with a zone when one is written), ``20261201`` as an int, ``yes`` as a bool,
``2026-12-01T10:00`` (no seconds) and ``yesterday`` as strings, and raised a bare
``ValueError`` (no line, an internal error) for ``2026-13-01`` and ``2026-02-30``, which match
its timestamp pattern but are no day of the calendar ("month must be in 1..12").
What is valid is computed here independently: ``YYYY-MM-DD`` that ``datetime.date`` accepts.
"""

from __future__ import annotations

import datetime as dt
import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fleetctl.errors import InputError
from fleetctl.nightly import load_allowlist
from tests.commands.test_report import live, make_fleet, report

GOOD = ("accept:\n"
        "  - host: h1\n"
        "    path: runner/b.txt\n"
        "    kind: hand-patch\n"
        "    reason: a good entry first, so the bad one is not on line 2\n"
        "    expires: 2099-01-01\n")


def entry(expires_line: str | None) -> str:
    """The allowlist: a good entry, then one whose ``expires`` line is ``expires_line``
    (left out when ``None``)."""
    return GOOD + ("  - host: h1\n"
                   "    path: runner/a.txt\n"
                   "    kind: hand-patch\n"
                   "    reason: the entry under test\n"
                   + (f"{expires_line}\n" if expires_line is not None else ""))


def line_of(text: str, needle: str, nth: int = 1) -> int:
    """1-based line of the ``nth`` line starting (after spaces) with ``needle``, found here."""
    lines = [i + 1 for i, line in enumerate(text.splitlines()) if line.lstrip().startswith(needle)]
    return lines[nth - 1]


BAD = [
    ("    expires: 2026-13-01", "'2026-13-01' is no day of the calendar"),
    ("    expires: 2026-02-30", "'2026-02-30' is no day of the calendar"),
    ("    expires: 2026-12-01T10:00:00", "2026-12-01 10:00:00 is a date and time, not a day"),
    ("    expires: 2026-12-01T10:00", "'2026-12-01T10:00' is not a date"),
    ("    expires: 2026-12-01 10:00:00+02:00", "is a date and time with a time zone"),
    ("    expires: 2026-12-01T10:00:00Z", "is a date and time with a time zone"),
    ("    expires: 20261201", "20261201 is a number to YAML, not a date"),
    ("    expires: '20261201'", "'20261201' is not a date"),
    ("    expires: yesterday", "'yesterday' is not a date"),
    ("    expires: yes", "true is yes/no to YAML, not a date"),
    ("    expires: [2026-12-01]", "expected a date, got a list"),
    ("    expires:", "accept[1].expires: empty"),
    # str.isdigit() takes other scripts' digits: these are no date, not a bad day.
    ("    expires: '\uff12\uff10\uff12\uff16-12-31'", "'\uff12\uff10\uff12\uff16-12-31' is not a date"),
    ("    expires: '2026-12-\u00b9\u00b2'", "'2026-12-\u00b9\u00b2' is not a date"),
    # A rule over a value holds on the whole value (the tryout found these accepted).
    ('    expires: "2026-12-31\\n"', "has white space around the date"),
    ("    expires: ' 2026-12-31'", "has white space around the date"),
]


@pytest.fixture(scope="module")
def fleet(tmp_path_factory):
    base = tmp_path_factory.mktemp("allow")
    inv, bp = make_fleet(base, hosts=("h1",))
    (live(base, "h1") / "runner" / "a.txt").write_text("A\n")
    return base, inv, bp


def test_bad_dates_name_file_line_and_key_through_the_cli(fleet):
    """Each bad ``expires`` through ``fleetctl report``: exit 2, the message names the file,
    the line of ``expires`` and ``accept[1].expires``, no traceback, nothing on stdout and no
    night kept in --history."""
    base, inv, bp = fleet
    allow = base / "accepted.yaml"
    hist = base / "history"
    for line, expected in BAD:
        text = entry(line)
        allow.write_text(text)
        run = report(inv, bp, "--allowlist", str(allow), "--history", str(hist))
        assert run.code == 2, (line, run.stdout, run.stderr)
        want = f"accepted.yaml:{line_of(text, 'expires:', 2)}: accept[1].expires: "
        assert want in run.stderr, (line, run.stderr)
        assert expected in run.stderr, (line, run.stderr)
        assert "YYYY-MM-DD" in run.stderr
        assert "Traceback" not in run.stderr and "internal error" not in run.stderr
        assert run.stdout == "" and not hist.exists()
    # A missing expires: the entry's line (there is no key to point at).
    text = entry(None)
    allow.write_text(text)
    run = report(inv, bp, "--allowlist", str(allow))
    assert run.code == 2
    assert f"accepted.yaml:{line_of(text, '- host:', 2)}: accept[1]: expires: missing" in \
        run.stderr


def test_good_dates_and_an_expired_entry(fleet):
    """Quoted or not, ``YYYY-MM-DD`` holds through that day; an expired entry is not an input
    error: its finding fails again (exit 1) and the entry is listed with its file and line."""
    base, inv, bp = fleet
    allow = base / "accepted-good.yaml"
    for line in ("    expires: 2026-12-01", "    expires: '2026-12-01'"):
        allow.write_text(entry(line))
        run = report(inv, bp, "--allowlist", str(allow), "--now", "2026-12-01T23:00:00Z")
        assert run.code == 0, (line, run.stdout + run.stderr)
        (a,) = [f for f in run.doc["findings"] if f["subject"] == "runner/a.txt"]
        assert a["accepted"]["expires"] == "2026-12-01"
    text = entry("    expires: 2026-11-30")
    allow.write_text(text)
    run = report(inv, bp, "--allowlist", str(allow), "--now", "2026-12-01T00:00:00Z")
    assert run.code == 1
    (gone,) = run.doc["allowlist"]["expired"]
    assert gone["where"].endswith(f"accepted-good.yaml:{line_of(text, '- host:', 2)}")


def test_a_bad_date_in_the_inventory_is_an_input_error_not_an_internal_one(tmp_path):
    """The loader's fix holds for every YAML file: ``2026-13-01`` in the inventory is the
    string written (here an unknown key's value), so the error is an ordinary one with a line."""
    from tests.helpers import cli, local_host, make_project, write_inventory

    bp = make_project(tmp_path, {"runner": {"a.txt": "a\n"}})
    inv = write_inventory(tmp_path / "inv.yaml", {"h1": local_host(tmp_path / "h1", {})})
    inv.write_text(inv.read_text() + "born: 2026-13-01\n")
    run = cli("drift", inventory=inv, blueprint=bp)
    assert run.code == 2, run.stdout + run.stderr
    assert "inv.yaml:" in run.stderr and "born" in run.stderr
    assert "Traceback" not in run.stderr and "internal error" not in run.stderr


DATEISH = st.from_regex(
    r"\A[0-9]{4}-[0-9]{1,2}-[0-9]{1,2}([T ][0-9]{1,2}:[0-9]{2}(:[0-9]{2})?(Z|[+-][0-9]{2}:[0-9]{2})?)?\Z")


@settings(max_examples=300, deadline=None)
@given(value=DATEISH, quoted=st.booleans())
def test_property_an_entry_holds_exactly_the_real_days(tmp_path_factory, value, quoted):
    """For any date-like ``expires``, quoted or not: the entry loads iff the text is
    ``YYYY-MM-DD`` naming a real day (computed here), and then with that day; otherwise the
    error is an :class:`InputError` naming the file, the line and ``accept[1].expires``."""
    path = tmp_path_factory.mktemp("prop") / "accepted.yaml"
    text = entry(f"    expires: {repr(value) if quoted else value}")
    path.write_text(text)
    m = re.fullmatch(r"([0-9]{4})-([0-9]{2})-([0-9]{2})", value)
    day = None
    if m:
        try:
            day = dt.date(*map(int, m.groups()))
        except ValueError:
            day = None
    if day is not None:
        assert load_allowlist(path)[1].expires == day
        return
    with pytest.raises(InputError) as caught:
        load_allowlist(path)
    assert f"accepted.yaml:{line_of(text, 'expires:', 2)}: accept[1].expires: " in \
        str(caught.value.message)

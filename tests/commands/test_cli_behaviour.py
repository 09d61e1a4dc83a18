"""Behaviour a user meets at the terminal and in CI: the demo, confirmation on a terminal only,
timeouts, and reversible escaping of names that are not UTF-8."""

from __future__ import annotations

import os
import pty
import re
import select
import subprocess
import sys
import time
from pathlib import Path

import pytest

from fleetctl.names import escape_name, unescape_name
from tests.helpers import cli, git, local_host, make_project, snapshot, write_inventory

REPO = Path(__file__).resolve().parents[2]


def test_demo_script_runs_every_step(tmp_path):
    """The README's first command, end to end, on a copy of the repository."""
    copy = tmp_path / "repo"
    subprocess.run(["git", "clone", "-q", str(REPO), str(copy)], check=True)
    # Reuse this run's environment instead of installing again: the demo's setup step is
    # exercised by CI's own run of scripts/setup.sh.
    os.symlink(Path(sys.executable).resolve().parent.parent, copy / ".venv")
    done = subprocess.run(["bash", "scripts/demo.sh"], cwd=copy, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    for line in ("-> exit 0 (shipped)", "-> exit 1 (drift found)", "-> exit 3 (refused)",
                 "-> exit 0 (in sync)", "-> exit 1 (findings)",
                 "demo: all steps behaved as expected"):
        assert line in done.stdout
    assert "hand-patch" in done.stdout and "no-own-user" in done.stdout
    assert "credentials/engineer/forge-token.env" in done.stdout  # the rotation, as a digest
    # Not one of the demo's secret values is printed, and none is inside a release.
    values = [ln.split("=", 1)[1] for ln in (copy / "scripts" / "demo-secrets.sh").read_text()
              .splitlines() if ln.startswith("export ")]
    values.append("demo-forge-engineer-rotated-44c2")
    assert len(values) == 8
    for value in values:
        assert value not in done.stdout + done.stderr
    assert "no secret in any release" in done.stdout


def _run_in_pty(argv: list[str], answer: bytes, cwd: Path, timeout_s: float = 60,
                before_answer=None) -> tuple[int, bytes]:
    pid, fd = pty.fork()
    if pid == 0:  # child
        os.chdir(cwd)
        os.execv(argv[0], argv)
    out = b""
    answered = False
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        ready, _, _ = select.select([fd], [], [], 0.5)
        if ready:
            try:
                block = os.read(fd, 4096)
            except OSError:
                break
            if not block:
                break
            out += block
            if not answered and b"[y/N]" in out:
                if before_answer is not None:
                    before_answer()
                os.write(fd, answer + b"\n")
                answered = True
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status), out


@pytest.mark.parametrize("answer,code", [(b"n", 3), (b"y", 0)])
def test_ship_asks_on_a_terminal(tmp_path, answer, code):
    bp = make_project(tmp_path, {"runner": {"a": "a\n"}})
    root = tmp_path / "box"
    inv = write_inventory(tmp_path / "inv.yaml", {"h": local_host(root)})
    exe = str(Path(sys.executable).parent / "fleetctl")
    status, out = _run_in_pty([exe, "ship", "--inventory", str(inv), "--blueprint", str(bp)],
                              answer, tmp_path)
    assert b"Ship 5 change(s) to 1 host(s)?" in out
    assert status == code, out.decode(errors="replace")
    if code == 3:
        assert not root.exists()
    else:
        assert (root / "current" / "runner" / "a").read_bytes() == b"a\n"


def test_ship_never_asks_to_ship_what_the_all_or_nothing_rule_refuses(tmp_path):
    """Two hosts shipped, then a blueprint change for both and a hand-patch on one: on a
    terminal, without ``--yes``, ship shows the plan, says the patched host stops the fleet
    and exits 3 without asking (the other host is held back); nothing is written on either.
    Before: it asked "Ship 2 change(s) to 1 host(s)?" and a "y" was then refused."""
    bp = make_project(tmp_path, {"runner": {"a": "a\n"}})
    inv = write_inventory(tmp_path / "inv.yaml", {"h1": local_host(tmp_path / "b1"),
                                                  "h2": local_host(tmp_path / "b2")})
    assert cli("ship", "--yes", inventory=inv, blueprint=bp).code == 0
    (bp / "runner" / "a").write_text("a, second\n")
    git(tmp_path, "commit", "-qam", "second")
    (tmp_path / "b2" / "current" / "runner" / "a").write_text("patched on h2\n")
    before = {name: snapshot(tmp_path / name) for name in ("b1", "b2")}
    exe = str(Path(sys.executable).parent / "fleetctl")
    status, out = _run_in_pty([exe, "ship", "--inventory", str(inv), "--blueprint", str(bp)],
                              b"y", tmp_path)
    text = out.decode(errors="replace")
    assert b"[y/N]" not in out, text
    assert status == 3, text
    assert "refused: h2 cannot be shipped, and a fleet ships all or nothing" in text, text
    assert "h1: refused [stopped at held-back]" in text, text
    assert {name: snapshot(tmp_path / name) for name in ("b1", "b2")} == before


def test_a_confirmed_plan_that_changed_names_the_paths_that_differ(tmp_path):
    """``ship --force``: the plan is shown and confirmed, but between the question and the
    answer a person edits one file on the host and changes the mode of another (``--force``
    would overwrite both unseen): the plan made again under the lock differs (docs/design.md
    (j)), ship refuses (exit 3) and names exactly those two paths; nothing is written. Before: "the host changed after the plan was confirmed", no
    path."""
    bp = make_project(tmp_path, {"runner": {"a": "a\n", "b": "b\n", "c": "c\n"}})
    root = tmp_path / "box"
    inv = write_inventory(tmp_path / "inv.yaml", {"h": local_host(root)})
    assert cli("ship", "--yes", inventory=inv, blueprint=bp).code == 0
    (bp / "runner" / "c").write_text("c, second\n")
    git(tmp_path, "commit", "-qam", "second")

    seen = {}

    def edit_on_the_host():
        (root / "current" / "runner" / "a").write_text("patched meanwhile\n")
        os.chmod(root / "current" / "runner" / "b", 0o600)
        seen["before"] = snapshot(root)

    exe = str(Path(sys.executable).parent / "fleetctl")
    status, out = _run_in_pty([exe, "ship", "--force", "--inventory", str(inv), "--blueprint",
                               str(bp)], b"y", tmp_path, before_answer=edit_on_the_host)
    text = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", out.decode(errors="replace")).replace(
        "\r\n", "\n")
    assert status == 3, text
    assert "the host changed after the plan was confirmed; nothing was shipped: 2 path(s) " \
        "differ from the confirmed plan\n  runner/a\n  runner/b\n" in text, text
    assert snapshot(root) == seen["before"]


def test_no_question_without_a_terminal(tmp_path):
    bp = make_project(tmp_path, {"runner": {"a": "a\n"}})
    inv = write_inventory(tmp_path / "inv.yaml", {"h": local_host(tmp_path / "box")})
    run = cli("ship", inventory=inv, blueprint=bp)  # CliRunner's stdin is not a terminal
    assert run.code == 0 and "[y/N]" not in run.stderr + run.stdout


def test_a_hung_host_times_out_and_the_others_finish(tmp_path):
    bp = make_project(tmp_path, {"runner": {"a": "a\n"}})
    hang = tmp_path / "hang-python"
    hang.write_text("#!/bin/sh\nexec sleep 600\n")
    hang.chmod(0o755)
    inv = write_inventory(tmp_path / "inv.yaml", {
        "good": local_host(tmp_path / "good"),
        "stuck": local_host(tmp_path / "stuck", python=str(hang)),
    })
    # --timeout applies to both hosts: long enough for the good host's host-side program to start
    # on a busy machine (an interpreter start took over 1 s there), far below the hang's 600 s.
    timeout = "10"
    started = time.monotonic()
    held = cli("ship", "--yes", "--format", "json", "--timeout", timeout, inventory=inv,
               blueprint=bp)
    assert held.code == 2
    assert held.host("good")["status"] == "refused" and "stuck" in held.host("good")["error"]
    assert held.host("stuck")["status"] == "error" and "timed out" in held.host("stuck")["error"]
    assert not (tmp_path / "good").exists()  # all or nothing: the good host was not written
    run = cli("ship", "--yes", "--format", "json", "--timeout", timeout, "--skip-unreachable",
              inventory=inv, blueprint=bp)
    elapsed = time.monotonic() - started
    assert run.code == 2
    assert run.host("good")["status"] == "shipped"
    stuck = run.host("stuck")
    assert stuck["status"] == "error" and "timed out" in stuck["error"]
    assert elapsed < 300  # two runs cut at the timeout, not waiting out the hang (2 x 600 s)
    assert not (tmp_path / "stuck").exists() or snapshot(tmp_path / "stuck") == {}


def test_a_host_whose_interpreter_is_missing_is_an_error(tmp_path):
    bp = make_project(tmp_path, {"runner": {"a": "a\n"}})
    inv = write_inventory(tmp_path / "inv.yaml", {
        "h": local_host(tmp_path / "box", python=str(tmp_path / "no-such-python"))})
    run = cli("drift", "--format", "json", inventory=inv, blueprint=bp)
    assert run.code == 2
    assert run.host("h")["status"] == "error"


@pytest.mark.parametrize("raw", [b"plain", b"bad\xff", b"back\\slash\xfe", b"\\x41\xc3", b"caf\xc3\xa9"])
def test_escaped_names_round_trip(raw):
    name = os.fsdecode(raw)
    text, escaped = escape_name(name)
    assert escaped == (raw != raw.decode("utf-8", "replace").encode("utf-8"))
    if escaped:
        assert os.fsencode(unescape_name(text)) == raw
    else:
        assert text == raw.decode("utf-8")


def test_help_shows_the_defaults():
    """Regression: rich took "[default: ...]" in help strings for markup and dropped it."""
    run = cli("drift", "--help")
    assert "[default: all]" in run.stdout
    assert "inventory/demo.yaml" in run.stdout


def test_declining_with_json_still_writes_the_document(tmp_path):
    bp = make_project(tmp_path, {"runner": {"a": "a\n"}})
    inv = write_inventory(tmp_path / "inv.yaml", {"h": local_host(tmp_path / "box")})
    exe = str(Path(sys.executable).parent / "fleetctl")
    out_file = tmp_path / "out.json"
    status, _ = _run_in_pty([exe, "ship", "--format", "json", "--output", str(out_file),
                             "--inventory", str(inv), "--blueprint", str(bp)], b"n", tmp_path)
    import json
    assert status == 3
    doc = json.loads(out_file.read_text())
    assert doc["hosts"][0]["status"] == "declined" and doc["exit_code"] == 3


@pytest.mark.parametrize("name,expected", [
    ("runner/conf", "`runner/conf`"),
    ("a`b", "``a`b``"),
    ("`x", "`` `x ``"),
    ("a|b", "`a\\|b`"),
])
def test_markdown_code_spans_survive_backticks(name, expected):
    """Regression: a backtick in a name was backslash-escaped inside a code span, where
    Markdown does not honour backslashes."""
    from fleetctl.cli.output.markdown import md_code as _md_code
    assert _md_code(name) == expected


def test_an_internal_error_exits_2_with_the_traceback_only_under_debug(tmp_path, monkeypatch):
    """Anything that is not a user-facing error is an internal error: one line and a hint, exit
    2 (never 1, which CI reads as drift found); --debug adds the traceback. The failure is
    planted in the report renderer, past every per-host guard."""
    import fleetctl.cli.drift

    bp = make_project(tmp_path, {"runner": {"a": "a\n"}})
    inv = write_inventory(tmp_path / "inv.yaml", {"h": local_host(tmp_path / "box")})

    def broken(*_args, **_kw):
        raise ValueError("renderer exploded")

    monkeypatch.setattr(fleetctl.cli.drift, "to_json", broken)
    plain = cli("drift", "--format", "json", inventory=inv, blueprint=bp)
    assert plain.code == 2
    assert "internal error: ValueError: renderer exploded" in plain.stderr
    assert "--debug" in plain.stderr and "Traceback" not in plain.stderr
    debug = cli("drift", "--format", "json", "--debug", inventory=inv, blueprint=bp)
    assert debug.code == 2
    assert "Traceback" in debug.stderr and "renderer exploded" in debug.stderr

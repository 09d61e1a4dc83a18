"""Day two (issue 11), against real sshd boxes and real git: content diffs, backport, --force on
one path, releases, rollback and history, and a hostile host.

Expected diffs are computed here with difflib and plain YAML loading; files are read back with
plain ``open``; git's own ``diff``/``status`` say what backport changed.
"""

from __future__ import annotations

import difflib
import json
import os
import subprocess
from pathlib import Path

import pytest
import yaml

from tests.helpers import git, make_project, snapshot, ssh_host, write_inventory
from tests.commands.test_ship_guards import current_record
from tests.transport.test_ssh import drift, ship

TOKEN_CAP = {
    "capability.yaml": yaml.safe_dump({"scope": {"type": "object"}}),
    "tok.env.j2": "TOKEN={{ secret }}\n",
}
RUNNER = {
    "README": "line one\nline two\nline three\n",
    "conf.yaml": yaml.safe_dump({"port": 8080, "tags": ["a", "b"], "db": {"host": "x"}}),
    "blob.bin": b"\x00\x01\x02binary",
    "run.sh": "#!/bin/sh\necho run\n",
    "motd.j2": "welcome to {{ host.name }}\n",
}


@pytest.fixture
def fleet(tmp_path, sshd_pool, ssh_client_key, ssh_known_hosts, monkeypatch):
    """A committed blueprint (text, YAML, binary, a template, a credential grant) shipped to
    one sshd box; returns (inventory, blueprint, root, secret value)."""
    root = tmp_path / "root"
    bp = make_project(tmp_path / "proj", {"runner": dict(RUNNER),
                                          "credentials": {"tok": TOKEN_CAP}},
                      roles={"worker": {"prompt": "w", "capabilities": ["tok"]}},
                      executable=("runner/run.sh",))
    monkeypatch.setenv("DAY_TWO_TOKEN", "s3cret-value-42")
    inv = write_inventory(tmp_path / "inv.yaml", {"web1": ssh_host(
        sshd_pool[0], ssh_client_key, ssh_known_hosts, root,
        {"w1": {"role": "worker", "grants": {"tok": {"secret": {"env": "DAY_TWO_TOKEN"}}}}})})
    first = ship(inv, bp)
    assert first.code == 0, first.stdout + first.stderr
    return inv, bp, root


def live(root: Path, rel: str) -> Path:
    return Path(os.path.realpath(root / "current")) / rel


def patch(root: Path, rel: str, data: bytes | str, mode: int | None = None) -> None:
    """A person's hand-patch on the host, in place (as `vi` on the box would)."""
    path = live(root, rel)
    path.write_bytes(data.encode() if isinstance(data, str) else data)
    if mode is not None:
        os.chmod(path, mode)


def cli_text(*args: str) -> subprocess.CompletedProcess:
    import sys

    exe = str(Path(sys.executable).parent / "fleetctl")
    return subprocess.run([exe, *args], capture_output=True, text=True)


def test_drift_diff_shows_text_yaml_binary_and_never_a_secret(fleet):
    inv, bp, root = fleet
    patch(root, "runner/README", "line one\nline 2 edited\nline three\n")
    patch(root, "runner/conf.yaml", yaml.safe_dump({"port": 9090, "tags": ["a", "b"],
                                                    "db": {"host": "x"}, "debug": True}))
    patch(root, "runner/blob.bin", b"\x00\xffother")
    cred = root / "credentials" / "w1" / "tok.env"
    cred.write_text("TOKEN=hand-edited-secret\n")
    run = drift(inv, bp, "--diff")
    assert run.code == 1, run.stdout
    diffs = {d["path"]: d for d in run.host("web1")["diffs"]}
    expected = [line.rstrip("\n") for line in difflib.unified_diff(
        ["line one\n", "line 2 edited\n", "line three\n"],
        ["line one\n", "line two\n", "line three\n"],
        fromfile="live/runner/README", tofile="desired/runner/README", n=3)]
    assert diffs["runner/README"]["kind"] == "text"
    assert diffs["runner/README"]["lines"] == expected
    conf = diffs["runner/conf.yaml"]
    assert conf["kind"] == "structured"
    assert "~ root['port']: 9090 -> 8080" in conf["keys"]
    assert "- root['debug']: true" in conf["keys"]
    assert "-debug: true" in conf["lines"]  # the text diff follows the key-level view
    blob = diffs["runner/blob.bin"]
    assert blob["kind"] == "binary" and blob["lines"] == []
    import hashlib
    assert blob["live_digest"] == "sha256:" + hashlib.sha256(b"\x00\xffother").hexdigest()
    secret = diffs["credentials/w1/tok.env"]
    assert secret["kind"] == "secret" and secret["lines"] == []
    assert "hand-edited-secret" not in run.stdout and "s3cret-value-42" not in run.stdout
    text = cli_text("drift", "--diff", "--inventory", str(inv), "--blueprint", str(bp))
    assert "+line two" in text.stdout and "-line 2 edited" in text.stdout
    assert "hand-edited-secret" not in text.stdout + text.stderr


def test_hand_patch_backport_commit_ship_without_force_then_clean(fleet):
    inv, bp, root = fleet
    patch(root, "runner/README", "patched on the host\n")
    patch(root, "runner/run.sh", "#!/bin/sh\necho patched\n", 0o755)
    os.chmod(live(root, "runner/README"), 0o755)
    live(root, "runner/new-tool").write_text("added on the host\n")
    os.unlink(live(root, "runner/blob.bin"))
    refused = ship(inv, bp)
    assert refused.code == 3 and "backport" in refused.host("web1")["hint"]
    done = cli_text("backport", "web1", "--inventory", str(inv), "--blueprint", str(bp),
                    "--format", "json")
    doc = json.loads(done.stdout)
    actions = {i["path"]: i["action"] for i in doc["items"]}
    assert actions == {"runner/README": "written", "runner/run.sh": "written",
                       "runner/new-tool": "written", "runner/blob.bin": "removed"}, doc
    assert done.returncode == 0, done.stderr
    assert (bp / "runner" / "README").read_text() == "patched on the host\n"
    assert os.stat(bp / "runner" / "README").st_mode & 0o777 == 0o755
    assert (bp / "runner" / "new-tool").read_text() == "added on the host\n"
    assert not (bp / "runner" / "blob.bin").exists()
    assert any(line.startswith("+patched on the host") for line in doc["git_diff"])
    assert "new mode 100755" in "\n".join(doc["git_diff"])
    # Never committed for the user.
    assert git(bp, "status", "--porcelain", "--", ".").strip() != ""
    git(bp, "add", "-A")
    git(bp, "commit", "-q", "-m", "backport web1's hand-patches")
    shipped = ship(inv, bp)  # no --force
    assert shipped.code == 0, shipped.stdout
    assert drift(inv, bp).code == 0
    assert live(root, "runner/README").read_text() == "patched on the host\n"
    assert live(root, "runner/new-tool").read_text() == "added on the host\n"


def test_backport_refuses_templates_and_credentials_with_reasons(fleet):
    inv, bp, root = fleet
    patch(root, "runner/motd", "welcome, edited by hand\n")
    (root / "credentials" / "w1" / "tok.env").write_text("TOKEN=other\n")
    before = snapshot(bp)
    done = cli_text("backport", "web1", "--inventory", str(inv), "--blueprint", str(bp),
                    "--format", "json")
    assert done.returncode == 1, done.stdout + done.stderr
    items = {i["path"]: i for i in json.loads(done.stdout)["items"]}
    motd = items["runner/motd"]
    assert motd["action"] == "refused" and "runner/motd.j2" in motd["reason"]
    assert motd["diff"]["lines"] == [line.rstrip("\n") for line in difflib.unified_diff(
        ["welcome to web1\n"], ["welcome, edited by hand\n"], fromfile="rendered/runner/motd",
        tofile="live/runner/motd", n=3)]
    cred = items["credentials/w1/tok.env"]
    assert cred["action"] == "refused" and "tok" in cred["reason"] and "w1" in cred["reason"]
    assert "TOKEN=other" not in done.stdout
    assert snapshot(bp) == before  # nothing written


def test_backport_names_the_role_file_and_key_a_rendered_line_comes_from(
        tmp_path, sshd_pool, ssh_client_key, ssh_known_hosts):
    """A hand-patch to ``agents/w1/agent.yaml`` (rendered from fleetctl's own template) changes
    the prompt line, the budget line and the template's comment: backport refuses it and names
    where each belongs: ``blueprint/roles/worker.yaml:LINE: prompt``, the budget key (not set
    in that file: the default), the agent's and host's names the comment shows, and the
    template's text around them, and nothing it did not change; a patch to a blueprint ``*.j2``
    line names the variable it shows (the host's name) and the template. Before: only "fold
    the change into the template by hand", for a change that belongs in the role file."""
    repo = Path(__file__).resolve().parents[2]
    root = tmp_path / "root"
    bp = make_project(tmp_path / "proj", {"runner": dict(RUNNER)},
                      roles={"worker": {"prompt": "w", "max_retries": 2}},
                      executable=("runner/run.sh",),
                      agent_template=(repo / "templates" / "agent.yaml.j2").read_text())
    inv = write_inventory(tmp_path / "inv.yaml", {"web1": ssh_host(
        sshd_pool[0], ssh_client_key, ssh_known_hosts, root, {"w1": {"role": "worker"}})})
    assert ship(inv, bp).code == 0
    config = live(root, "agents/w1/agent.yaml")
    lines = config.read_text().splitlines(keepends=True)
    edited = ['# edited by hand\n' if ln.startswith("# Rendered") else
              'prompt: "w, but better"\n' if ln.startswith("prompt: ") else
              "budget_tokens: 9999\n" if ln.startswith("budget_tokens: ") else ln
              for ln in lines]
    assert sum(a != b for a, b in zip(lines, edited, strict=True)) == 3, lines
    config.write_text("".join(edited))
    patch(root, "runner/motd", "welcome, edited by hand\n")
    role_lines = (bp / "roles" / "worker.yaml").read_text().splitlines()
    prompt_line = next(i for i, ln in enumerate(role_lines, 1) if ln.startswith("prompt:"))
    assert not any(ln.startswith("budget_tokens:") for ln in role_lines)
    before = snapshot(bp)
    done = cli_text("backport", "web1", "--inventory", str(inv), "--blueprint", str(bp),
                    "--format", "json")
    assert done.returncode == 1, done.stdout + done.stderr
    items = {i["path"]: i for i in json.loads(done.stdout)["items"]}
    reason = items["agents/w1/agent.yaml"]["reason"]
    assert items["agents/w1/agent.yaml"]["action"] == "refused"
    assert f"blueprint/roles/worker.yaml:{prompt_line}: prompt" in reason, reason
    assert "blueprint/roles/worker.yaml: budget_tokens (not set there: the default applies)" \
        in reason, reason
    # The comment line shows the agent's and the host's names: those are named, and the text.
    assert "the inventory: the agent's name (hosts.web1.agents.w1)" in reason, reason
    assert "(or the text of templates/agent.yaml.j2 around them)" in reason, reason
    assert "max_retries" not in reason and "skills" not in reason, reason
    motd = items["runner/motd"]["reason"]
    assert "the inventory: the host's name (hosts.web1)" in motd, motd
    assert "blueprint/runner/motd.j2" in motd, motd
    assert snapshot(bp) == before


def test_force_path_overwrites_one_hand_patch_and_the_others_still_refuse(fleet):
    inv, bp, root = fleet
    patch(root, "runner/README", "patch A\n")
    patch(root, "runner/blob.bin", b"patch B")
    run = ship(inv, bp, "--force-path", "runner/README")
    assert run.code == 3, run.stdout
    assert "runner/blob.bin" in run.host("web1")["error"]
    assert "runner/README" not in run.host("web1")["error"]
    # The same with --force=PATH; and `--force PATH` is not taken for "force everything".
    eq = cli_text("ship", "--yes", "--format", "json", "--force=runner/README",
                  "--inventory", str(inv), "--blueprint", str(bp))
    assert eq.returncode == 3 and "runner/blob.bin" in json.loads(eq.stdout)["hosts"][0]["error"]
    spaced = cli_text("ship", "--yes", "--force", "runner/README", "--inventory", str(inv),
                      "--blueprint", str(bp))
    assert spaced.returncode == 2 and "--force-path runner/README" in spaced.stderr
    assert live(root, "runner/README").read_text() == "patch A\n"  # nothing was forced
    both = ship(inv, bp, "--force-path", "runner/README", "--force-path", "runner/blob.bin")
    assert both.code == 0, both.stdout
    assert current_record(root)["forced"]["paths"] == ["runner/README", "runner/blob.bin"] or \
        sorted(current_record(root)["forced"]["paths"]) == ["runner/README", "runner/blob.bin"]
    assert drift(inv, bp).code == 0


def test_releases_rollback_and_history(fleet):
    inv, bp, root = fleet
    first = current_record(root)
    (bp / "runner" / "README").write_text("second release\n")
    git(bp, "add", "-A")
    git(bp, "commit", "-q", "-m", "second")
    second_commit = git(bp, "rev-parse", "HEAD").strip()
    assert ship(inv, bp).code == 0
    patch(root, "runner/README", "hand-patched\n")
    assert ship(inv, bp, "--force").code == 0  # a forced ship, for the history
    listed = cli_text("releases", "web1", "--inventory", str(inv), "--format", "json")
    doc = json.loads(listed.stdout)
    releases = doc["releases"]
    assert len(releases) == 3 and [r["current"] for r in releases] == [False, False, True]
    assert releases[0]["commit"] == first["source"]["commit"]
    assert releases[1]["commit"] == second_commit and releases[1]["clean"] is True
    assert releases[2]["forced"] is True
    # Roll back to the first release: verified, switched, recorded.
    target = releases[0]["id"]
    back = cli_text("rollback", "web1", "--to", target, "--inventory", str(inv),
                    "--format", "json")
    assert back.returncode == 0, back.stdout + back.stderr
    assert os.readlink(root / "current") == f"releases/{target}"
    assert live(root, "runner/README").read_text() == RUNNER["README"]
    # Drift compares against the release in use; the newer commit is not called stale.
    seen = drift(inv, bp)
    assert seen.host("web1")["commit"] == first["source"]["commit"]
    assert seen.host("web1")["ancestry"]["relation"] == "ahead"
    assert {c["origin"] for c in seen.host("web1")["changes"]} == {"pending"}
    # A tampered release is refused, naming what differs, unless forced.
    tampered = releases[1]["id"]
    (root / "releases" / tampered / "runner" / "README").write_text("edited in place\n")
    no = cli_text("rollback", "web1", "--to", tampered, "--inventory", str(inv))
    assert no.returncode == 3, no.stdout + no.stderr
    assert "runner/README: content" in no.stderr
    # ... and says what to do: --force, or another release (before: no hint at all).
    assert f"hint: fleetctl rollback web1 --to {tampered} --force" in no.stderr, no.stderr
    assert os.readlink(root / "current") == f"releases/{target}"
    yes = cli_text("rollback", "web1", "--to", tampered, "--force", "--inventory", str(inv))
    assert yes.returncode == 0, yes.stderr
    history = json.loads(cli_text("history", "--inventory", str(inv), "--format",
                                  "json").stdout)
    kinds = [(e["kind"], e["forced"]) for e in history["entries"]]
    assert kinds == [("ship", False), ("ship", False), ("ship", True), ("rollback", False),
                     ("rollback", True)], history
    assert history["entries"][3]["release"] == target
    assert all(e["host"] == "web1" and "@" in e["by"] for e in history["entries"])
    # The edit made in that release is live now, so it is a hand-patch like any other.
    again = ship(inv, bp)
    assert again.code == 3 and "runner/README" in again.host("web1")["error"]
    assert ship(inv, bp, "--force-path", "runner/README").code == 0
    assert drift(inv, bp).code == 0


def test_a_later_ship_after_a_rollback_is_not_stale(fleet):
    inv, bp, root = fleet
    (bp / "runner" / "README").write_text("second release\n")
    git(bp, "add", "-A")
    git(bp, "commit", "-q", "-m", "second")
    assert ship(inv, bp).code == 0
    back = cli_text("rollback", "web1", "--inventory", str(inv))  # default: the previous one
    assert back.returncode == 0, back.stderr
    assert live(root, "runner/README").read_text() == RUNNER["README"]
    again = ship(inv, bp)  # from the newer commit: ahead of the release in use
    assert again.code == 0, again.stdout
    assert live(root, "runner/README").read_text() == "second release\n"


def test_a_hostile_host_cannot_write_outside_the_blueprint_or_drive_the_terminal(fleet):
    inv, bp, root = fleet
    # Escape sequences in content: shown escaped.
    patch(root, "runner/README", "\x1b]0;pwned\x07\x1b[2Jclear\n")
    text = cli_text("drift", "--diff", "--inventory", str(inv), "--blueprint", str(bp))
    assert "\x1b" not in text.stdout and "\\x1b" in text.stdout
    # A symlink planted in the blueprint where backport writes: replaced, never written through.
    from fleetctl.backport import _write_file

    outside = bp.parent.parent / "outside.txt"
    outside.write_text("untouched\n")
    (bp / "runner" / "README").unlink()
    (bp / "runner" / "README").symlink_to(outside)
    _write_file(bp, "runner/README", b"from the host\n", 0o644)
    assert outside.read_text() == "untouched\n"
    assert not (bp / "runner" / "README").is_symlink()
    assert (bp / "runner" / "README").read_text() == "from the host\n"
    # A path where only the blueprint changed is nothing to bring home.
    (bp / "runner" / "blob.bin").write_bytes(b"changed in the blueprint")
    named = cli_text("backport", "web1", "runner/blob.bin", "--inventory", str(inv),
                     "--blueprint", str(bp), "--format", "json")
    (item,) = json.loads(named.stdout)["items"]
    assert item["action"] == "nothing" and "pending" in item["reason"]
    # A directory of the blueprint replaced by a symlink out: never written through.
    from fleetctl.backport import _write_file

    elsewhere = bp.parent.parent / "elsewhere"
    elsewhere.mkdir()
    os.rename(bp / "runner", bp / "runner.real")
    (bp / "runner").symlink_to(elsewhere)
    with pytest.raises(OSError):
        _write_file(bp, "runner/README", b"x", 0o644)
    assert list(elsewhere.iterdir()) == []
    # A '..' path named on the command line is refused before anything is read.
    bad = cli_text("backport", "web1", "../../etc/passwd", "--inventory", str(inv),
                   "--blueprint", str(bp))
    assert bad.returncode == 2 and "plain path" in bad.stderr


HOSTILE = """#!/usr/bin/python3
# A hostile host's "python3": it ignores the program it is sent, takes the nonce from the
# request (a host sees its input), and answers a scan with a name that climbs out of the tree.
import json, sys
inp = sys.stdin.buffer
for _ in range(2):  # the program, then the request
    data = inp.read(int(inp.readline()))
nonce = json.loads(data)["nonce"]
for event in [
        {"t": "hello", "nonce": nonce, "user": "root", "group": "root", "uid": 0,
         "python": "3.11.0"},
        {"t": "state", "root_exists": True, "current": "r1", "current_kind": "symlink",
         "releases": ["r1"], "shipped": True, "identity": None, "meta": {}},
        {"t": "shipped", "path": "runner", "type": "dir", "mode": "0755", "owner": "root:root"},
        {"t": "entry", "path": "runner/../../../escape", "type": "file", "mode": "0644",
         "owner": "root:root", "size": 1, "digest": "sha256:00"},
        {"t": "scan-end", "entries": 1, "unreadable": 0, "digest": "sha256:00"}]:
    print(json.dumps(event), flush=True)
"""


def test_a_host_that_sends_a_climbing_name_is_stopped(tmp_path):
    from tests.helpers import local_host

    bp = make_project(tmp_path / "proj", {"runner": {"a": "a\n"}})
    fake = tmp_path / "hostile-python"
    fake.write_text(HOSTILE)
    fake.chmod(0o755)
    inv = write_inventory(tmp_path / "inv.yaml", {"evil": local_host(tmp_path / "box",
                                                                     python=str(fake))})
    run = drift(inv, bp)
    assert run.code == 2, run.stdout
    assert "not a plain relative path" in run.host("evil")["error"]
    done = cli_text("backport", "evil", "--inventory", str(inv), "--blueprint", str(bp))
    assert done.returncode == 2 and "not a plain relative path" in done.stderr
    assert not (tmp_path / "escape").exists() and not (tmp_path.parent / "escape").exists()


def test_what_a_trial_found(fleet, tmp_path):
    """Defects a new user's trial found, each fixed: a name that is not UTF-8 in backport's
    JSON, a relative symlink that climbs out, a formatting-only YAML change, a damaged record
    of an old release, documents on failure, --force-path checks."""
    inv, bp, root = fleet
    # A hand-made file whose name is not UTF-8: JSON stays valid UTF-8, escaped and marked.
    raw = os.path.join(os.fsencode(live(root, "runner")), b"caf\xe9.txt")
    with open(raw, "wb") as fh:
        fh.write(b"x\n")
    os.symlink("../../../../../../etc/shadow", live(root, "runner/rel-link"))
    done = cli_text("backport", "web1", "--inventory", str(inv), "--blueprint", str(bp),
                    "--format", "json")
    doc = json.loads(done.stdout.encode("utf-8"))
    items = {i["path"]: i for i in doc["items"]}
    assert items["runner/caf\\xe9.txt"]["path_escaped"] is True
    assert items["runner/rel-link"]["action"] == "refused"
    assert "leads out of the tree" in items["runner/rel-link"]["reason"]
    assert not (bp / "runner" / "rel-link").is_symlink()
    # A leading slash is not a path of the tree.
    slash = cli_text("backport", "web1", "/runner/README", "--inventory", str(inv),
                     "--blueprint", str(bp))
    assert slash.returncode == 2 and "plain path" in slash.stderr
    for bad in ("../x", "", "/etc"):
        forced = cli_text("ship", "--yes", "--force-path", bad, "--inventory", str(inv),
                          "--blueprint", str(bp))
        assert forced.returncode == 2 and "--force-path" in forced.stderr, (bad, forced.stderr)
    # A damaged record of an old release: listed with its problem, never rolled back to.
    (bp / "runner" / "README").write_text("second\n")
    git(bp, "add", "-A")
    git(bp, "commit", "-q", "-m", "second")
    assert ship(inv, bp, "--force").code == 0
    old = sorted(p for p in (root / "releases").iterdir())[0].name
    (root / ".fleetctl" / "releases" / f"{old}.json").write_text("{bad")
    listed = json.loads(cli_text("releases", "web1", "--inventory", str(inv), "--format",
                                 "json").stdout)
    (entry,) = [r for r in listed["releases"] if r["id"] == old]
    assert entry["problem"] and "cannot be used" in entry["problem"]
    back = cli_text("rollback", "web1", "--to", old, "--inventory", str(inv), "--format",
                    "json")
    assert back.returncode == 2, back.stdout + back.stderr
    failed = json.loads(back.stdout)
    assert failed["exit_code"] == 2 and "cannot be verified" in failed["error"]
    assert "Traceback" not in back.stderr and "JSONDecodeError:" not in back.stderr


def test_a_formatting_only_change_is_shown_as_text():
    from fleetctl.diffs import diff_contents

    diff = diff_contents("a.json", b'{"a": 1, "b": [1, 2]}\n', b'{\n  "a": 1,\n  "b": [1, 2]\n}\n')
    assert diff.kind == "text" and diff.lines and "written differently" in diff.note
    changed = diff_contents("a.yaml", b"a: 1\n", b"a: 2\n")
    assert changed.kind == "structured" and changed.keys == ("~ root['a']: 1 -> 2",)
    assert changed.lines[-2:] == ("-a: 1", "+a: 2")


# Names drift prints escaped (docs/json.md, names shown to people), with that form written out
# here by hand: what a person copies from drift's output into a PATH argument.
SHOWN_NAMES = {
    b"runner/nl\nname": "runner/nl\\x0aname",
    b"runner/bad\xff": "runner/bad\\xff",
    b"runner/esc\x1b[31mred": "runner/esc\\x1b[31mred",
    b"runner/cr\rname": "runner/cr\\x0dname",
    b"runner/lit\\x41": "runner/lit\\\\x41",  # a real backslash: shown doubled
}


def _hand_patch_hostile(root: Path) -> None:
    for i, name in enumerate(SHOWN_NAMES):
        with open(os.path.realpath(root / "current").encode() + b"/" + name, "wb") as fh:
            fh.write(b"hand %d\n" % i)


def test_paths_are_taken_as_drift_shows_them(fleet):
    """A PATH argument in the form drift printed it (escaped) names that file: backport brings
    the very bytes home under the very name, and --force-path overwrites exactly the paths
    named. Before, the shown form matched nothing ('no change on the host there') though
    docs/releases.md says a path is given as drift shows it."""
    inv, bp, root = fleet
    _hand_patch_hostile(root)
    shown = list(SHOWN_NAMES.values())
    back = cli_text("backport", "web1", shown[0], shown[1], "--inventory", str(inv),
                    "--blueprint", str(bp))
    assert back.returncode == 0, back.stdout + back.stderr
    for i, name in enumerate(list(SHOWN_NAMES)[:2]):
        with open(str(bp).encode() + b"/" + name, "rb") as fh:
            assert fh.read() == b"hand %d\n" % i
    git(bp.parent, "checkout", "--", ".")
    git(bp.parent, "clean", "-fdq")
    some = ship(inv, bp, *[a for p in shown[:-1] for a in ("--force-path", p)])
    assert some.code == 3, some.stdout
    assert "runner/lit\\\\x41" in some.host("web1")["error"], some.host("web1")
    assert not some.host("web1")["warnings"], some.host("web1")
    every = ship(inv, bp, *[a for p in shown for a in ("--force-path", p)])
    assert every.code == 0, every.stdout
    current = os.path.realpath(root / "current").encode()
    assert not [n for n in SHOWN_NAMES if os.path.lexists(current + b"/" + n)]

"""Drift and the audits without every secret (issue 11): a secret source that gives no value (an
unset variable, a missing program, a missing file, a failing command) no longer makes the whole
host an error. Drift still reports everything else, compares the credential files of that grant
with the shipped record alone (a hand-patch is still found) and names the grants it could not
check; ``creds audit`` runs every rule that needs no value and names the ones it skipped; ship
still needs every secret and names all that are missing before it touches the host.

Real parts only: real users (created by ship), real files, real environment variables, real
programs as command sources, a real git blueprint; expected digests are computed here with
hashlib from the bytes the test itself wrote.
"""

from __future__ import annotations

import hashlib
import os
import secrets
import shutil
import stat
import tempfile
from pathlib import Path

import pytest
import yaml

from tests.helpers import cli, local_host, make_project, snapshot, write_inventory

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="needs root (ship creates users)")

TOKEN_CAP = {
    "capability.yaml": yaml.safe_dump({"scope": {"type": "object"}}),
    "tok.env.j2": "TOKEN={{ secret }}\n",
}
DB_CAP = {
    "capability.yaml": yaml.safe_dump({"scope": {"type": "object"}}),
    "db.env.j2": "DB={{ secret }}\n",
}
ROLES = {"worker": {"prompt": "w", "capabilities": ["tok", "db"]}}


def sha(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


@pytest.fixture
def host_root():
    """A managed root other users can traverse (pytest's own tmp dirs are 0700 root)."""
    top = Path(tempfile.mkdtemp(prefix="fleetctl-optsec-"))
    os.chmod(top, 0o755)
    yield top / "box"
    shutil.rmtree(top, ignore_errors=True)


class Fleet:
    """Two agents (a: tok, b: db), each with its own user; sources chosen per test."""

    def __init__(self, tmp: Path, root: Path, users, monkeypatch) -> None:
        self.tmp, self.root, self.monkeypatch = tmp, root, monkeypatch
        self.bp = make_project(tmp, {"runner": {"run": "r\n"},
                                     "credentials": {"tok": TOKEN_CAP, "db": DB_CAP}},
                               roles=ROLES)
        self.inv = tmp / "inv.yaml"
        self.a, self.b = users.name("a"), users.name("b")
        self.values: dict[str, str] = {}

    def secret(self, var: str) -> str:
        value = f"planted-{secrets.token_hex(12)}"
        self.monkeypatch.setenv(var, value)
        self.values[var] = value
        return value

    def configure(self, source_a: dict, source_b: dict, hosts: tuple[str, ...] = ("h",)) -> None:
        inv = {}
        for i, name in enumerate(hosts):
            agents = {"a": {"role": "worker", "user": self.a,
                            "grants": {"tok": {"scope": {}, "secret": source_a}}},
                      "b": {"role": "worker", "user": self.b,
                            "grants": {"db": {"scope": {}, "secret": source_b}}}}
            inv[name] = local_host(self.root if i == 0 else Path(f"{self.root}{i}"), agents)
        write_inventory(self.inv, inv)

    def run(self, *args: str):
        return cli(*args, inventory=self.inv, blueprint=self.bp)

    def assert_no_value(self, *texts: str) -> None:
        for text in texts:
            for var, value in self.values.items():
                assert value not in text, f"the value of {var} leaked"


@pytest.fixture
def fleet(tmp_path, host_root, real_users, monkeypatch):
    return Fleet(tmp_path, host_root, real_users, monkeypatch)


def shipped(fleet: Fleet) -> tuple[str, str]:
    """Ship with both secrets available; return (value of a, value of b)."""
    va, vb = fleet.secret("TOK_A"), fleet.secret("DB_B")
    fleet.configure({"env": "TOK_A"}, {"env": "DB_B"})
    run = fleet.run("ship", "--yes")
    assert run.code == 0, run.stdout + run.stderr
    return va, vb


def test_drift_without_one_secret_reports_everything_else_and_finds_the_hand_patch(fleet):
    """TOK_A unset: drift exits 1 (not 2), reports the hand-patched runner file, the
    hand-patched credential file of the unchecked grant (live digest against the shipped one)
    and the untouched one of b not at all; ``unchecked_grants`` names agent a's grant."""
    va, _vb = shipped(fleet)
    fleet.monkeypatch.delenv("TOK_A")
    (fleet.root / "current" / "runner" / "run").write_text("patched on the host\n")
    cred = fleet.root / "credentials" / "a" / "tok.env"
    assert cred.read_bytes() == f"TOKEN={va}\n".encode()
    patched = f"TOKEN=hand-{secrets.token_hex(8)}\n".encode()
    cred.write_bytes(patched)
    run = fleet.run("drift", "--format", "json")
    assert run.code == 1, run.stdout + run.stderr
    host = run.host("h")
    assert host["status"] == "drift" and host["error"] is None
    got = {(c["path"], c["change"], c["origin"]) for c in host["changes"]}
    assert got == {("runner/run", "content", "hand-patch"),
                   ("credentials/a/tok.env", "content", "hand-patch")}
    change = next(c for c in host["changes"] if c["path"] == "credentials/a/tok.env")
    assert change["before"]["digest"] == sha(patched)
    assert change["shipped"]["digest"] == sha(f"TOKEN={va}\n".encode())
    assert change["after"]["digest"] == change["shipped"]["digest"]  # compared with the record
    (unchecked,) = host["unchecked_grants"]
    assert {k: unchecked[k] for k in ("agent", "capability", "source", "source_name", "paths")} \
        == {"agent": "a", "capability": "tok", "source": "env",
            "source_name": "environment variable TOK_A", "paths": ["credentials/a/tok.env"]}
    assert unchecked["reason"] == "secret from environment variable TOK_A: the variable is not set"
    assert unchecked["where"].endswith("hosts.h.agents.a.grants.tok")
    text = fleet.run("drift")
    assert text.code == 1
    assert "unchecked: grant tok of agent a" in text.stdout
    assert "environment variable TOK_A" in text.stdout
    fleet.assert_no_value(run.stdout, run.stderr, text.stdout, text.stderr)
    assert patched.decode().strip() not in run.stdout + text.stdout


@pytest.mark.parametrize("kind", ["env-unset", "file-missing", "file-not-regular",
                                  "program-missing", "command-fails"])
def test_each_kind_of_unavailable_source_leaves_an_in_sync_host_in_sync(fleet, kind):
    """A host as shipped, then the source of b's grant becomes unavailable in each way: drift
    exits 0 (in sync: the credential still equals the shipped record), names the grant with
    its source kind, and reports no change."""
    shipped(fleet)
    secret_dir = fleet.tmp / "srcdir"
    secret_dir.mkdir()
    source, expected_kind, reason = {
        "env-unset": ({"env": "DB_GONE"}, "env", "the variable is not set"),
        "file-missing": ({"file": "srcdir/absent"}, "file", "file not found"),
        "file-not-regular": ({"file": "srcdir"}, "file", "not a regular file"),
        "program-missing": ({"command": ["/nonexistent/fleet-secret-tool", "get"]}, "command",
                            "program not found"),
        "command-fails": ({"command": ["sh", "-c", "echo vault sealed >&2; exit 3"]}, "command",
                          "exited with status 3: vault sealed"),
    }[kind]
    fleet.monkeypatch.delenv("DB_GONE", raising=False)
    fleet.configure({"env": "TOK_A"}, source)
    run = fleet.run("drift", "--format", "json")
    assert run.code == 0, run.stdout + run.stderr
    host = run.host("h")
    assert host["status"] == "in-sync" and host["changes"] == []
    (unchecked,) = host["unchecked_grants"]
    assert (unchecked["agent"], unchecked["capability"], unchecked["source"]) == (
        "b", "db", expected_kind)
    assert reason in unchecked["reason"], unchecked["reason"]
    fleet.assert_no_value(run.stdout, run.stderr)


def test_a_removed_credential_and_a_wrong_mode_are_still_found(fleet):
    """Without b's secret, drift still compares what needs no value: b's file removed on the
    host is ``missing``; a's file (secret available) chmod 0644 is a ``mode`` hand-patch."""
    shipped(fleet)
    fleet.monkeypatch.delenv("DB_B")
    (fleet.root / "credentials" / "b" / "db.env").unlink()
    os.chmod(fleet.root / "credentials" / "a" / "tok.env", 0o644)
    run = fleet.run("drift", "--format", "json")
    assert run.code == 1, run.stdout + run.stderr
    assert {(c["path"], c["change"], c["origin"]) for c in run.host("h")["changes"]} == {
        ("credentials/b/db.env", "missing", "hand-patch"),
        ("credentials/a/tok.env", "mode", "hand-patch")}
    assert [u["agent"] for u in run.host("h")["unchecked_grants"]] == ["b"]


def test_ship_names_every_missing_secret_and_writes_nothing(fleet):
    """Both secrets unavailable (an env variable and a program): ship exits 2 with one error
    naming both grants, their agents and source kinds, no value; the host is untouched (a new
    host's root is not even created; a shipped host's tree is byte for byte the same)."""
    fleet.monkeypatch.delenv("TOK_NONE", raising=False)
    fleet.configure({"env": "TOK_NONE"}, {"command": ["/nonexistent/vault-cli", "read"]})
    run = fleet.run("ship", "--yes", "--format", "json")
    assert run.code == 2, run.stdout + run.stderr
    error = run.host("h")["error"]
    assert "2 secret(s)" in error
    assert "grant tok of agent a" in error and "environment variable TOK_NONE" in error
    assert "grant db of agent b" in error and "command /nonexistent/vault-cli" in error
    assert "program not found" in error and "nothing was sent" in error
    assert not fleet.root.exists()
    # A shipped host: the same, and not one byte of it changes (dry run too).
    shipped(fleet)
    before = snapshot(fleet.root)
    fleet.monkeypatch.delenv("TOK_A")
    for args in (("ship", "--yes"), ("ship", "--dry-run")):
        again = fleet.run(*args, "--format", "json")
        assert again.code == 2, again.stdout + again.stderr
        assert "grant tok of agent a" in again.host("h")["error"]
        assert "grant db" not in again.host("h")["error"]
    assert snapshot(fleet.root) == before
    fleet.assert_no_value(run.stdout, run.stderr)


def test_a_failing_command_source_runs_once_per_run_for_every_host(fleet):
    """Three hosts share a command source that fails: drift runs it once, and every host
    names it as unchecked (a slow or timing-out source costs its time once, not per host)."""
    counter = fleet.tmp / "runs"
    script = fleet.tmp / "fail.sh"
    script.write_text(f"#!/bin/sh\necho x >> {counter}\necho locked >&2\nexit 1\n")
    script.chmod(0o755)
    fleet.secret("TOK_A")
    fleet.configure({"env": "TOK_A"}, {"command": [str(script)]}, hosts=("h", "h1", "h2"))
    run = fleet.run("drift", "--format", "json")
    assert run.code == 1, run.stdout + run.stderr  # never shipped: everything is missing
    for name in ("h", "h1", "h2"):
        (u,) = run.host(name)["unchecked_grants"]
        assert u["source"] == "command" and "exited with status 1: locked" in u["reason"]
    assert counter.read_text() == "x\n"


def test_full_audit_without_one_secret_runs_the_live_rules(fleet):
    """``creds audit`` (live) with DB_B unset: the host is scanned, b's credential made 0644 on
    the host is ``readable-by-others``, ``shared-secret`` is named as skipped for b's grant, and
    the exit is 1 (findings), not 2."""
    shipped(fleet)
    fleet.monkeypatch.delenv("DB_B")
    path = fleet.root / "credentials" / "b" / "db.env"
    os.chmod(path, 0o644)
    assert stat.S_IMODE(os.lstat(path).st_mode) == 0o644
    run = fleet.run("creds", "audit", "--format", "json")
    assert run.code == 1, run.stdout + run.stderr
    (host,) = run.doc["hosts"]
    assert host["status"] == "findings" and host["scanned"] is True
    assert ("b", "readable-by-others", "credentials/b/db.env") in {
        (f["agent"], f["rule"], f["path"]) for f in run.doc["findings"]}
    assert [(s["rule"], s["agent"], s["capability"], s["source"]) for s in host["skipped"]] == [
        ("shared-secret", "b", "db", "env")]
    fleet.assert_no_value(run.stdout, run.stderr)


def test_render_names_every_missing_grant_from_the_library(fleet):
    """The library call a ship makes raises one error naming all missing grants; with
    ``missing_secrets_ok`` it returns the tree with their files listed, without a digest."""
    from fleetctl.blueprint import load_blueprint
    from fleetctl.credentials import SecretsMissing
    from fleetctl.inventory import load_inventory
    from fleetctl.render import render_host

    fleet.monkeypatch.delenv("TOK_X", raising=False)
    fleet.monkeypatch.delenv("DB_X", raising=False)
    fleet.configure({"env": "TOK_X"}, {"env": "DB_X"})
    bp = load_blueprint(fleet.bp)
    host = load_inventory(fleet.inv, blueprint=bp).hosts[0]
    with pytest.raises(SecretsMissing) as caught:
        render_host(bp, host)
    assert [(u.agent, u.capability) for u in caught.value.unchecked] == [("a", "tok"), ("b", "db")]
    tree = render_host(bp, host, missing_secrets_ok=True)
    assert [u.paths for u in tree.unchecked] == [("credentials/a/tok.env",),
                                                ("credentials/b/db.env",)]
    entry = tree.manifest.get("credentials/b/db.env")
    assert (entry.type, entry.mode, entry.digest) == ("file", "0600", None)
    assert tree.secrets == {}


def test_a_secret_file_open_to_others_is_unchecked_not_read(fleet):
    """A secret file too open (0644) is refused as a source (never spread); drift names it
    as unchecked with the chmod reason, and the file is left as it was."""
    shipped(fleet)
    src = fleet.tmp / "db-secret"
    src.write_text("value-from-file\n")
    os.chmod(src, 0o644)
    fleet.configure({"env": "TOK_A"}, {"file": str(src)})
    run = fleet.run("drift", "--format", "json")
    (u,) = run.host("h")["unchecked_grants"]
    assert "mode 0644 lets group or others at it" in u["reason"]
    # The shipped value differs from the file's; without reading it drift cannot know: in sync.
    assert run.code == 0 and run.host("h")["changes"] == []
    assert stat.S_IMODE(os.stat(src).st_mode) == 0o644
    assert "value-from-file" not in run.stdout + run.stderr


def test_ship_lists_each_missing_secret_on_its_own_line_with_the_chmod_fix(fleet):
    """Three grants' secrets unavailable (an unset variable, a secret file others can read, a
    missing program): ship's text output gives each its own line naming the grant, its agent
    and its source, and the too-open file's line and the hint carry ``chmod 600 PATH``; the
    file's mode is left as it was. Before: all on one line joined by "; ", and the chmod hint
    of the file source was dropped for a generic one."""
    roles = {"worker": {"prompt": "w", "capabilities": ["tok", "db"]}}
    fleet.bp = make_project(fleet.tmp / "three", {
        "runner": {"run": "r\n"}, "credentials": {"tok": TOKEN_CAP, "db": DB_CAP}}, roles=roles)
    loose = fleet.tmp / "db-secret"
    loose.write_text("value-in-a-loose-file\n")
    os.chmod(loose, 0o644)
    fleet.monkeypatch.delenv("TOK_NONE", raising=False)
    inv = {"h": local_host(fleet.root, {
        "a": {"role": "worker", "user": fleet.a,
              "grants": {"tok": {"scope": {}, "secret": {"env": "TOK_NONE"}},
                         "db": {"scope": {}, "secret": {"file": str(loose)}}}},
        "b": {"role": "worker", "user": fleet.b,
              "grants": {"tok": {"scope": {}, "secret": {"command": ["/nonexistent/vault"]}}}}})}
    write_inventory(fleet.inv, inv)
    run = fleet.run("ship", "--yes")
    assert run.code == 2, run.stdout + run.stderr
    lines = (run.stdout + run.stderr).splitlines()
    first = next(i for i, ln in enumerate(lines) if "3 secret(s)" in ln)
    assert lines[first].startswith("h: error"), lines[first]
    grants = {ln.split(" (")[0]: ln for ln in lines[first + 1:first + 4]}
    assert sorted(grants) == [
        "  grant db of agent a", "  grant tok of agent a", "  grant tok of agent b"], grants
    assert "environment variable TOK_NONE" in grants["  grant tok of agent a"]
    assert f"fix: chmod 600 {loose}" in grants["  grant db of agent a"]
    assert "mode 0644" in grants["  grant db of agent a"]
    assert "command /nonexistent/vault" in grants["  grant tok of agent b"]
    hints = [ln for ln in lines if ln.strip().startswith("hint:")]
    assert any(f"chmod 600 {loose}" in ln for ln in hints), hints
    assert stat.S_IMODE(os.stat(loose).st_mode) == 0o644
    assert not fleet.root.exists()
    assert "value-in-a-loose-file" not in run.stdout + run.stderr

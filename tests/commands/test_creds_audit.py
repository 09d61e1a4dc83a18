"""``fleetctl creds audit``: static findings from blueprint + inventory, live findings from hosts.

Everything real: a git blueprint with capabilities and skills, inventories on disk, secrets from
the environment (unique ``token_hex`` values that must never appear in anything fleetctl prints
or writes), local hosts shipped by ``fleetctl ship`` and then damaged by hand (chmod, chown,
planted files), real Linux users (useradd/userdel) and a real sshd box.
"""

from __future__ import annotations

import grp
import hashlib
import json
import os
import pwd
import secrets
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.helpers import cli, local_host, make_project, ssh_host, write_inventory
from tests.sshd_boxes import free_port

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="needs root (real users, chown)")

FORGE = """description: forge token
scope:
  type: object
  additionalProperties: false
  required: [repositories, permission]
  properties:
    repositories: {type: array, items: {type: string}}
    permission: {enum: [read, write]}
audit:
  broad:
    repositories: ['/\\*$']
  write:
    permission: [write]
"""
DATABASE = """description: database login
scope:
  type: object
  additionalProperties: false
  required: [database, access]
  properties:
    database: {type: string}
    access: {enum: [read-only, read-write]}
audit:
  write:
    access: [read-write]
"""
CHAT = """description: chat token
scope:
  type: object
  properties:
    channels: {type: array, items: {type: string}}
"""


def skill(name: str, needs: str | None) -> dict:
    front = f"---\nname: {name}\n" + (f"capabilities: {needs}\n" if needs else "") + "---\n"
    return {"SKILL.md": front + f"# {name}\n"}


BLUEPRINT = {
    "runner": {"run.sh": "#!/bin/sh\necho run\n"},
    "skills": {
        "coder": skill("coder", "{forge: write}"),
        "reader": skill("reader", "{database: read}"),
        "lister": skill("lister", "{forge: read}"),
        "plain": skill("plain", None),
    },
    "credentials": {
        "forge": {"capability.yaml": FORGE, "forge.env.j2": "FORGE_TOKEN={{ secret }}\n"},
        "database": {"capability.yaml": DATABASE,
                     "database.env.j2": "DB={{ scope.database }}\nDB_PASSWORD={{ secret }}\n"},
        "chat": {"capability.yaml": CHAT, "chat.env.j2": "CHAT_TOKEN={{ secret }}\n"},
    },
}
ROLES = {
    # dev: writes with forge, reads the database; chat is declared but no skill uses it.
    "dev": {"prompt": "dev", "skills": ["coder", "reader", "plain"],
            "capabilities": ["forge", "database", "chat"]},
    # analyst: only reads (forge and database).
    "analyst": {"prompt": "analyst", "skills": ["lister", "reader"],
                "capabilities": ["forge", "database"]},
}


@pytest.fixture
def project(tmp_path: Path) -> Path:
    """The blueprint directory of a fresh project."""
    return make_project(tmp_path, BLUEPRINT, roles=ROLES, executable=("runner/run.sh",))


@pytest.fixture
def planted(monkeypatch) -> dict[str, str]:
    """Unique secret values in the environment: name → value (never to be printed)."""
    values = {}
    for name in ("S_FORGE", "S_DB", "S_CHAT", "S_FORGE2", "S_DB2", "S_SAME"):
        values[name] = "v" + secrets.token_hex(16)
        monkeypatch.setenv(name, values[name])
    return values


def make_user(prefix: str = "fca") -> str:
    name = prefix + secrets.token_hex(4)
    subprocess.run(["useradd", "--no-create-home", "--user-group", "-s", "/usr/sbin/nologin",
                    name], check=True, capture_output=True)
    return name


def drop_user(name: str) -> None:
    subprocess.run(["userdel", "-r", name], check=False, capture_output=True)
    subprocess.run(["groupdel", name], check=False, capture_output=True)


@pytest.fixture
def users():
    """Fresh Linux users (each with its own group): call ``users()`` for one more name; all are
    deleted (userdel -r) when the test ends."""
    made: list[str] = []

    def new() -> str:
        made.append(make_user())
        return made[-1]

    yield new
    for name in made:
        drop_user(name)


def env(name: str) -> dict:
    return {"env": name}


def dev_agent(user: str | None, home: Path | None = None, **grants: dict) -> dict:
    agent: dict = {"role": "dev"}
    if user:
        agent["user"] = user
    if home is not None:
        agent["home"] = str(home)
        if user:  # the account's own HOME must be the one the inventory names
            subprocess.run(["usermod", "-d", str(home), user], check=False, capture_output=True)
    agent["grants"] = grants
    return agent


def clean_grants() -> dict:
    """Grants a dev agent needs and nothing more: forge (named repo, write), database (read)."""
    return {"forge": {"scope": {"repositories": ["acme/app"], "permission": "write"},
                      "secret": env("S_FORGE")},
            "database": {"scope": {"database": "crm", "access": "read-only"},
                         "secret": env("S_DB")}}


def audit(inv: Path, bp: Path, *args: str):
    return cli("creds", "audit", *args, inventory=inv, blueprint=bp)


def assert_no_secret(planted: dict[str, str], *texts: str) -> None:
    for text in texts:
        for name, value in planted.items():
            assert value not in text, f"the value of {name} leaked"


def rules(run) -> set[tuple[str, str | None, str | None, str]]:
    """``(host, agent, capability, rule)`` of every finding of a JSON run."""
    return {(f["host"], f["agent"], f["capability"], f["rule"]) for f in run.doc["findings"]}


# -- static -------------------------------------------------------------------------------------


def test_static_clean_audit_exits_0(tmp_path, project, planted, users):
    """An agent with its own user and exactly the grants its skills need: no finding, exit 0,
    in every format; no host is contacted (its root does not even exist)."""
    u = users()
    inv = write_inventory(tmp_path / "inv.yaml", {
        "h1": local_host(tmp_path / "nowhere", {"a1": dev_agent(u, **clean_grants())})})
    run = audit(inv, project, "--static", "-f", "json")
    assert run.code == 0, run.stdout + run.stderr
    assert run.doc["schema_version"] == 1
    assert run.doc["findings"] == []
    assert run.doc["hosts"] == [{"host": "h1", "status": "clean", "exit_code": 0, "scanned": False,
                                 "findings": 0, "error": None, "hint": None, "unreadable": [],
                                 "skipped": []}]
    assert run.doc["summary"]["findings"] == 0
    assert not (tmp_path / "nowhere").exists()
    text = audit(inv, project, "--static")
    md = audit(inv, project, "--static", "-f", "markdown")
    assert text.code == md.code == 0
    assert "h1: clean, 0 finding(s)" in text.stdout
    assert md.stdout.startswith("# fleetctl creds audit")
    assert_no_secret(planted, run.stdout, run.stderr, text.stdout, text.stderr, md.stdout)


def test_broad_scope(tmp_path, project, planted, users):
    """A wildcard repository (``acme/*``: the whole organisation) is ``broad-scope`` (high), with
    the inventory line of the grant; exit 1."""
    grants = clean_grants()
    grants["forge"]["scope"]["repositories"] = ["acme/app", "acme/*"]
    inv = write_inventory(tmp_path / "inv.yaml", {
        "h1": local_host(tmp_path / "r", {"a1": dev_agent(users(), **grants)})})
    run = audit(inv, project, "--static", "-f", "json")
    assert run.code == 1, run.stdout + run.stderr
    assert rules(run) == {("h1", "a1", "forge", "broad-scope")}
    (finding,) = run.doc["findings"]
    assert finding["severity"] == "high" and finding["kind"] == "static"
    assert "acme/*" in finding["message"]
    assert finding["where"].startswith(f"{inv}:")
    assert finding["where"].endswith(": hosts.h1.agents.a1.grants.forge")
    assert_no_secret(planted, run.stdout, run.stderr)


def test_write_scope_where_skills_only_read(tmp_path, project, planted, users):
    """database read-write for a role whose only database skill reads: ``write-not-needed``;
    forge write for an analyst (lister reads) too; forge write for dev (coder writes) is fine."""
    grants = clean_grants()
    grants["database"]["scope"]["access"] = "read-write"
    analyst = {"role": "analyst", "user": users(), "grants": {
        "forge": {"scope": {"repositories": ["acme/app"], "permission": "write"},
                  "secret": env("S_FORGE2")},
        "database": {"scope": {"database": "crm", "access": "read-only"},
                     "secret": env("S_DB2")}}}
    inv = write_inventory(tmp_path / "inv.yaml", {"h1": local_host(tmp_path / "r", {
        "a1": dev_agent(users(), **grants), "a2": analyst})})
    run = audit(inv, project, "--static", "-f", "json")
    assert run.code == 1, run.stdout + run.stderr
    assert rules(run) == {("h1", "a1", "database", "write-not-needed"),
                          ("h1", "a2", "forge", "write-not-needed")}
    assert all(f["severity"] == "medium" for f in run.doc["findings"])
    assert_no_secret(planted, run.stdout, run.stderr)


def test_capability_granted_but_used_by_no_skill(tmp_path, project, planted, users):
    """chat is declared by the dev role (so the inventory loads) but no skill of it uses chat:
    ``unused-grant`` (and not also write-not-needed)."""
    grants = {**clean_grants(), "chat": {"scope": {"channels": ["#x"]}, "secret": env("S_CHAT")}}
    inv = write_inventory(tmp_path / "inv.yaml", {
        "h1": local_host(tmp_path / "r", {"a1": dev_agent(users(), **grants)})})
    run = audit(inv, project, "--static", "-f", "json")
    assert run.code == 1, run.stdout + run.stderr
    assert rules(run) == {("h1", "a1", "chat", "unused-grant")}
    assert_no_secret(planted, run.stdout, run.stderr)


def test_one_secret_value_granted_to_two_agents(tmp_path, project, planted, users, monkeypatch):
    """Two agents on two hosts granted the same value (through two different variables):
    ``shared-secret`` on each side, naming the other and a short digest, never the value."""
    monkeypatch.setenv("S_FORGE2", planted["S_FORGE"])  # same value, another source
    other = clean_grants()
    other["forge"]["secret"] = env("S_FORGE2")
    other["database"]["secret"] = env("S_DB2")
    inv = write_inventory(tmp_path / "inv.yaml", {
        "h1": local_host(tmp_path / "r1", {"a1": dev_agent(users(), **clean_grants())}),
        "h2": local_host(tmp_path / "r2", {"b1": dev_agent(users(), **other)})})
    run = audit(inv, project, "--static", "-f", "json")
    assert run.code == 1, run.stdout + run.stderr
    assert rules(run) == {("h1", "a1", "forge", "shared-secret"),
                          ("h2", "b1", "forge", "shared-secret")}
    short = "sha256:" + hashlib.sha256(planted["S_FORGE"].encode()).hexdigest()[:12]
    by_agent = {f["agent"]: f for f in run.doc["findings"]}
    assert "h2/b1" in by_agent["a1"]["message"] and short in by_agent["a1"]["message"]
    assert "h1/a1" in by_agent["b1"]["message"]
    text = audit(inv, project, "--static")
    md = audit(inv, project, "--static", "-f", "markdown")
    assert text.code == md.code == 1
    assert "shared-secret" in text.stdout and "shared-secret" in md.stdout
    assert_no_secret({**planted, "S_FORGE2": planted["S_FORGE"]}, run.stdout, run.stderr,
                     text.stdout, text.stderr, md.stdout, md.stderr)


def test_agents_without_their_own_user(tmp_path, project, planted, users, monkeypatch):
    """No user (``no-own-user``), two agents sharing one user (``shared-user`` on both), user
    root (``root-user``); each with the inventory line of the agent."""
    shared = users()
    g = clean_grants

    def distinct(prefix: str) -> dict:
        out = g()
        out["forge"]["secret"] = env(f"{prefix}_F")
        out["database"]["secret"] = env(f"{prefix}_D")
        return out

    for prefix in ("A", "B", "C", "D"):
        for suffix in ("F", "D"):
            planted[f"{prefix}_{suffix}"] = "v" + secrets.token_hex(16)
            monkeypatch.setenv(f"{prefix}_{suffix}", planted[f"{prefix}_{suffix}"])
    inv = write_inventory(tmp_path / "inv.yaml", {"h1": local_host(tmp_path / "r", {
        "nobody": dev_agent(None, **distinct("A")),
        "s1": dev_agent(shared, **distinct("B")),
        "s2": dev_agent(shared, **distinct("C")),
        "boss": dev_agent("root", **distinct("D"))})})
    run = audit(inv, project, "--static", "-f", "json")
    assert run.code == 1, run.stdout + run.stderr
    assert rules(run) == {("h1", "nobody", None, "no-own-user"),
                          ("h1", "s1", None, "shared-user"), ("h1", "s2", None, "shared-user"),
                          ("h1", "boss", None, "root-user")}
    where = {f["agent"]: f["where"] for f in run.doc["findings"]}
    assert where["nobody"].endswith("hosts.h1.agents.nobody")
    assert where["s1"].endswith("hosts.h1.agents.s1.user")
    assert_no_secret(planted, run.stdout, run.stderr)


def test_a_user_with_uid_0_under_another_name_is_root_user_when_live(tmp_path, project, planted,
                                                                    users, monkeypatch):
    """Only the host can tell that ``user: x`` is uid 0 (a second root entry in /etc/passwd):
    the live audit reports it as ``root-user``, kind ``live``; the static one cannot."""
    alias = "fca" + secrets.token_hex(4)
    subprocess.run(["useradd", "--non-unique", "--uid", "0", "--gid", "0", "--no-create-home",
                    "--shell", "/usr/sbin/nologin", alias], check=True, capture_output=True)
    try:
        for suffix in ("F", "D"):
            planted[f"Z_{suffix}"] = "v" + secrets.token_hex(16)
            monkeypatch.setenv(f"Z_{suffix}", planted[f"Z_{suffix}"])
        grants = clean_grants()
        grants["forge"]["secret"], grants["database"]["secret"] = env("Z_F"), env("Z_D")
        inv = write_inventory(tmp_path / "inv.yaml", {"h1": local_host(tmp_path / "r", {
            "z": dev_agent(alias, **grants)})})
        live = audit(inv, project, "-f", "json")
        [found] = [f for f in live.doc["findings"] if f["rule"] == "root-user"]
        assert found["agent"] == "z" and found["kind"] == "live" and "uid 0" in found["message"]
        static = audit(inv, project, "--static", "-f", "json")
        assert "root-user" not in {f["rule"] for f in static.doc["findings"]}
        assert_no_secret(planted, live.stdout, live.stderr)
    finally:
        subprocess.run(["userdel", "--force", alias], capture_output=True)


def test_unresolvable_secret_skips_only_the_rule_that_needs_it(tmp_path, project, planted, users):
    """A grant whose variable is unset no longer makes its host ``error``: every rule that needs
    no secret value runs on it (its broad scope is still found), ``shared-secret`` is named as
    skipped for that grant (rule, agent, capability, source kind, never a value), and the other
    host is audited as before. (Before issue 11: that host was ``error``, exit 2.)"""
    unset = "S_UNSET_" + secrets.token_hex(4).upper()
    broken = clean_grants()
    broken["database"]["secret"] = env(unset)
    broken["forge"]["scope"]["repositories"] = ["acme/*"]
    fine = clean_grants()
    fine["forge"]["secret"], fine["database"]["secret"] = env("S_FORGE2"), env("S_DB2")
    inv = write_inventory(tmp_path / "inv.yaml", {
        "bad": local_host(tmp_path / "r1", {"a1": dev_agent(users(), **broken)}),
        "ok": local_host(tmp_path / "r2", {"b1": dev_agent(None, **fine)})})
    run = audit(inv, project, "--static", "-f", "json")
    assert run.code == 1, run.stdout + run.stderr
    hosts = {h["host"]: h for h in run.doc["hosts"]}
    assert hosts["bad"]["status"] == "findings" and hosts["bad"]["error"] is None
    assert ("bad", "a1", "forge", "broad-scope") in rules(run)
    assert hosts["bad"]["skipped"] == [{
        "rule": "shared-secret", "agent": "a1", "capability": "database", "source": "env",
        "source_name": f"environment variable {unset}",
        "reason": f"secret from environment variable {unset}: the variable is not set",
        "where": hosts["bad"]["skipped"][0]["where"]}]
    assert hosts["bad"]["skipped"][0]["where"].endswith("hosts.bad.agents.a1.grants.database")
    assert hosts["ok"]["status"] == "findings" and hosts["ok"]["skipped"] == []
    assert ("ok", "b1", None, "no-own-user") in rules(run)
    assert run.doc["summary"]["skipped"] == 1
    text = audit(inv, project, "--static")
    # The line is wrapped at spaces to 80 columns in a pipe: compared with single spaces.
    assert f"skipped: shared-secret for grant database of agent a1: secret from environment " \
           f"variable {unset}" in " ".join(text.stdout.split())
    assert_no_secret(planted, run.stdout, run.stderr, text.stdout, text.stderr)


def test_output_file_and_bad_input(tmp_path, project, planted, users):
    """``--output`` gets the document (nothing on stdout), with no secret in it; an unknown host
    is exit 2 with no document."""
    grants = clean_grants()
    grants["forge"]["scope"]["repositories"] = ["*"]
    inv = write_inventory(tmp_path / "inv.yaml", {
        "h1": local_host(tmp_path / "r", {"a1": dev_agent(users(), **grants)})})
    out = tmp_path / "report.md"
    run = audit(inv, project, "--static", "-f", "markdown", "-o", str(out))
    assert run.code == 1 and run.stdout == ""
    body = out.read_text()
    assert "`broad-scope`" in body and "| high | h1 | a1 | forge |" in body
    assert_no_secret(planted, body, run.stderr)
    missing = audit(inv, project, "--static", "nosuch")
    assert missing.code == 2 and "no host named nosuch" in missing.stderr


# -- live ---------------------------------------------------------------------------------------


def ship(inv: Path, bp: Path):
    run = cli("ship", "--yes", "-f", "json", inventory=inv, blueprint=bp)
    assert run.code == 0, run.stdout + run.stderr
    return run


def owner_of(path: Path) -> str:
    st = os.lstat(path)
    return f"{pwd.getpwuid(st.st_uid).pw_name}:{grp.getgrgid(st.st_gid).gr_name}"


def test_live_clean_after_ship(tmp_path, project, planted, users):
    """Shipped and untouched: exit 0, the host scanned, and the secrets on disk only in the
    agent's own 0600 files."""
    u = users()
    root = tmp_path / "root"
    inv = write_inventory(tmp_path / "inv.yaml", {"h1": local_host(root, {
        "a1": dev_agent(u, tmp_path / "home-a1", **clean_grants())})})
    ship(inv, project)
    creds = root / "credentials" / "a1"
    assert owner_of(creds / "forge.env") == f"{u}:{u}"
    run = audit(inv, project, "-f", "json")
    assert run.code == 0, run.stdout + run.stderr
    assert run.doc["hosts"][0]["status"] == "clean" and run.doc["hosts"][0]["scanned"] is True
    assert_no_secret(planted, run.stdout, run.stderr)


def test_live_findings_on_a_damaged_host(tmp_path, project, planted, users):
    """After a ship: a credential file made 0644 and the agent's directory 0755
    (``readable-by-others``), a file given to another user (``wrong-owner``), planted files
    (a revoked grant's, a removed agent's, a leftover ``.fleetctl-new-*``: ``stale-secret-file``),
    one HOME made 0755 and another owned by someone else (``home-readable``); exit 1; a file
    the audit wrote holds no secret."""
    u1, u2, stranger = users(), users(), users()
    root = tmp_path / "root"
    g2 = clean_grants()
    g2["forge"]["secret"], g2["database"]["secret"] = env("S_FORGE2"), env("S_DB2")
    inv = write_inventory(tmp_path / "inv.yaml", {"h1": local_host(root, {
        "a1": dev_agent(u1, tmp_path / "home-a1", **clean_grants()),
        "a2": dev_agent(u2, tmp_path / "home-a2", **g2)})})
    ship(inv, project)
    c1, c2 = root / "credentials" / "a1", root / "credentials" / "a2"
    os.chmod(c1 / "forge.env", 0o644)
    os.chmod(c1, 0o755)
    sp = pwd.getpwnam(stranger)
    os.chown(c2 / "database.env", sp.pw_uid, sp.pw_gid)
    (c1 / "chat.env").write_text("old\n")
    (c1 / ".fleetctl-new-forge.env").write_text("half\n")
    (root / "credentials" / "gone").mkdir(mode=0o700)
    (root / "credentials" / "gone" / "token.env").write_text("revoked\n")
    os.chmod(tmp_path / "home-a1", 0o755)
    os.chown(tmp_path / "home-a2", sp.pw_uid, sp.pw_gid)

    out = tmp_path / "audit.json"
    run = audit(inv, project, "-f", "json", "-o", str(out))
    assert run.code == 1, run.stdout + run.stderr
    doc = json.loads(out.read_text())
    found = {(f["agent"], f["rule"], f["path"]) for f in doc["findings"] if f["kind"] == "live"}
    assert found == {
        ("a1", "readable-by-others", "credentials/a1/forge.env"),
        ("a1", "readable-by-others", "credentials/a1"),
        ("a2", "wrong-owner", "credentials/a2/database.env"),
        ("a1", "stale-secret-file", "credentials/a1/chat.env"),
        ("a1", "stale-secret-file", "credentials/a1/.fleetctl-new-forge.env"),
        (None, "stale-secret-file", "credentials/gone/token.env"),
        ("a1", "home-readable", str(tmp_path / "home-a1")),
        ("a2", "home-readable", str(tmp_path / "home-a2")),
    }, doc["findings"]
    assert {f["rule"] for f in doc["findings"] if f["kind"] == "static"} == set()
    capability = {f["path"]: f["capability"] for f in doc["findings"]}
    assert capability["credentials/a1/forge.env"] == "forge"  # from the grant, with its line
    assert capability["credentials/a1/chat.env"] == "chat"  # the revoked grant's capability
    assert capability["credentials/gone/token.env"] is None
    forge = next(f for f in doc["findings"] if f["path"] == "credentials/a1/forge.env")
    assert forge["where"].endswith(": hosts.h1.agents.a1.grants.forge")
    wrong = next(f for f in doc["findings"] if f["rule"] == "wrong-owner")
    assert f"{stranger}:{stranger}" in wrong["message"] and f"{u2}:{u2}" in wrong["message"]
    assert doc["summary"]["by_rule"]["stale-secret-file"] == 3
    text = audit(inv, project)
    assert text.code == 1 and "readable-by-others" in text.stdout
    assert_no_secret(planted, out.read_text(), run.stdout, run.stderr, text.stdout, text.stderr)


def test_live_audit_over_ssh(tmp_path, project, planted, users, sshd_pool, ssh_client_key,
                             ssh_known_hosts):
    """Over a real sshd box: ship, audit clean (exit 0); a credential file made 0640 is then
    ``readable-by-others`` (exit 1)."""
    u = users()
    root = tmp_path / "sshroot"
    inv = write_inventory(tmp_path / "inv.yaml", {"box": ssh_host(
        sshd_pool[0], ssh_client_key, ssh_known_hosts, root,
        {"a1": dev_agent(u, tmp_path / "home-ssh", **clean_grants())})})
    ship(inv, project)
    clean = audit(inv, project, "-f", "json", "--timeout", "30")
    assert clean.code == 0, clean.stdout + clean.stderr
    os.chmod(root / "credentials" / "a1" / "database.env", 0o640)
    run = audit(inv, project, "-f", "json", "--timeout", "30")
    assert run.code == 1, run.stdout + run.stderr
    assert {(f["host"], f["rule"], f["path"]) for f in run.doc["findings"]} == {
        ("box", "readable-by-others", "credentials/a1/database.env")}
    assert_no_secret(planted, clean.stdout, clean.stderr, run.stdout, run.stderr)


def test_unreachable_host_is_exit_2_and_the_others_are_audited(
        tmp_path, project, planted, users, sshd_pool, ssh_client_key, ssh_known_hosts):
    """One host on a port nobody listens on: it is ``error`` (exit 2) with its static findings
    kept; the local host is still scanned and its live finding reported."""
    u = users()
    root = tmp_path / "root"
    dead = ssh_host(sshd_pool[1], ssh_client_key, ssh_known_hosts, tmp_path / "dead",
                    {"d1": dev_agent(None, **{"database": {
                        "scope": {"database": "crm", "access": "read-only"},
                        "secret": env("S_DB2")}})})
    dead["port"] = free_port()
    inv = write_inventory(tmp_path / "inv.yaml", {
        "h1": local_host(root, {"a1": dev_agent(u, tmp_path / "home-a1", **clean_grants())}),
        "dead": dead})
    ship_run = cli("ship", "--yes", "-f", "json", "h1", inventory=inv, blueprint=project)
    assert ship_run.code == 0, ship_run.stdout + ship_run.stderr
    os.chmod(root / "credentials" / "a1" / "forge.env", 0o604)
    run = audit(inv, project, "-f", "json", "--timeout", "10")
    assert run.code == 2, run.stdout + run.stderr
    hosts = {h["host"]: h for h in run.doc["hosts"]}
    assert hosts["dead"]["status"] == "error" and hosts["dead"]["error"]
    assert hosts["dead"]["scanned"] is False
    assert hosts["h1"]["status"] == "findings" and hosts["h1"]["scanned"] is True
    assert rules(run) == {("h1", "a1", "forge", "readable-by-others"),
                          ("dead", "d1", None, "no-own-user")}
    text = audit(inv, project, "--timeout", "10")
    assert text.code == 2 and "dead: error" in text.stdout
    assert_no_secret(planted, run.stdout, run.stderr, text.stdout, text.stderr)


def test_a_writable_credentials_directory_is_a_finding(tmp_path, project, planted, users):
    """Whoever may write ``credentials/`` may replace an agent's 0700 directory with their own."""
    u = users()
    root = tmp_path / "root"
    inv = write_inventory(tmp_path / "inv.yaml", {"h1": local_host(root, {
        "a1": dev_agent(u, tmp_path / "home-a1", **clean_grants())})})
    ship(inv, project)
    assert audit(inv, project).code == 0
    os.chmod(root / "credentials", 0o777)
    run = audit(inv, project, "-f", "json")
    assert run.code == 1
    assert [(f["rule"], f["path"]) for f in run.doc["findings"]] == [
        ("readable-by-others", "credentials")]
    assert_no_secret(planted, run.stdout, run.stderr)


# -- text at 80 columns -------------------------------------------------------------------------


def test_the_text_fits_80_columns_in_a_pipe_with_every_path_and_key_whole():
    """``COLUMNS=80 fleetctl creds audit --static | cat`` on the repository's demo fleet: no
    line is wider than 80 unless it is one unbreakable word (a key, a path) on its own; every
    finding's message reads back whole from its lines, and its ``where`` (``file:line: key``)
    stands whole on one line, ready to copy; the facts are the JSON run's. Before: a table 160
    wide, the message and the key folded inside names."""
    repo = Path(__file__).resolve().parents[2]
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DEMO_", "FLEETCTL_"))}
    argv = [sys.executable, "-m", "fleetctl", "creds", "audit", "--static"]
    text = subprocess.run(argv, cwd=repo, capture_output=True, text=True, timeout=120,
                          env={**env, "COLUMNS": "80"})
    doc = json.loads(subprocess.run(argv + ["-f", "json"], cwd=repo, capture_output=True,
                                    text=True, timeout=120, env=env).stdout)
    assert text.returncode == 1 and doc["findings"], text.stdout + text.stderr
    lines = text.stdout.splitlines()
    for line in lines:
        assert len(line) <= 80 or len(line.strip().split(" ")) == 1 or \
            line.startswith(("  at: ", "  on the host: ")), line
    blocks = "\n".join(lines).split("\n\n")
    for f in doc["findings"]:
        head = f"{f['severity']} {f['rule']}: {f['host']}" + (
            f", agent {f['agent']}" if f["agent"] else "")
        (block,) = [b for b in blocks if b.startswith(head) and f["message"].split()[0] in b]
        body = [ln.strip() for ln in block.splitlines()[1:] if not ln.startswith("  at: ")]
        assert " ".join(body) == " ".join(f["message"].split()), block
        assert f"  at: {f['where']}" in block.splitlines(), block


@settings(max_examples=300, deadline=None)
@given(words=st.lists(st.text(alphabet=st.characters(blacklist_categories=("Zs", "Zl", "Zp", "Cc")),
                              min_size=1, max_size=40), min_size=1, max_size=30),
       width=st.integers(min_value=1, max_value=100))
def test_wrap_words_never_cuts_a_word_and_keeps_every_one(words, width):
    """For any words and width: the lines hold the same words in the same order, none cut, and
    a line is wider than ``width`` only when it is one word that is."""
    from fleetctl.cli.output.text import wrap_words

    text = " ".join(words)
    lines = wrap_words(text, width, "  ", "    ")
    assert " ".join(" ".join(ln.split()) for ln in lines).split() == text.split()
    for ln in lines:
        assert len(ln) <= max(width, 5) or len(ln.split()) == 1, (ln, width)

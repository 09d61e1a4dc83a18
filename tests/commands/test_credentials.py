"""Per-agent credentials (issue 5, docs/invariants.md, invariants 6 and 8): grants render only what is
granted, into ``<root>/credentials/<agent>/`` owned by the agent's own Linux user (0700/0600),
beside the releases; rotation and revocation leave no copy; drift shows digests only; a
permission refusal stops the host with the previous release in use; no secret value ever
appears in anything fleetctl prints or writes.

Real Linux users (created by ship, removed by the ``real_users`` fixture), real files, real sshd.
"""

from __future__ import annotations

import json
import os
import pwd
import secrets
import shutil
import stat
import subprocess
import tempfile
import threading
from pathlib import Path

import pytest
import yaml

from tests.helpers import cli, local_host, make_project, ssh_host, write_inventory

TOKEN_CAP = {
    "capability.yaml": yaml.safe_dump({
        "description": "a token for named repositories",
        "scope": {"type": "object", "additionalProperties": False, "required": ["repos", "permission"],
                  "properties": {"repos": {"type": "array", "minItems": 1,
                                           "items": {"type": "string"}},
                                 "permission": {"enum": ["read", "write"]}}},
    }),
    "tok.env.j2": "TOKEN={{ secret }}\nREPOS={{ scope.repos | join(',') }}\n",
}
DB_CAP = {
    "capability.yaml": yaml.safe_dump({"scope": {"type": "object"}}),
    "db.env.j2": "DB={{ secret }}\n",
}
ROLES = {"worker": {"prompt": "w", "capabilities": ["tok", "db"]}}


def token_file(value: str, repos: str = "acme/api") -> bytes:
    """What tok.env.j2 renders to, written out by hand."""
    return f"TOKEN={value}\nREPOS={repos}\n".encode()


@pytest.fixture
def host_root():
    """A managed root other users can traverse (pytest's own tmp dirs are 0700 root)."""
    root = Path(tempfile.mkdtemp(prefix="fleetctl-creds-"))
    os.chmod(root, 0o755)
    box = root / "box"
    yield box
    subprocess.run(["chattr", "-R", "-i", str(root)], capture_output=True)
    shutil.rmtree(root, ignore_errors=True)


class Fleet:
    """A blueprint with two capabilities and an inventory whose grants the test rewrites."""

    def __init__(self, tmp_path: Path, root: Path, users, monkeypatch) -> None:
        self.tmp = tmp_path
        self.root = root
        self.users = users
        self.monkeypatch = monkeypatch
        self.bp = make_project(tmp_path, {"runner": {"run": "r\n"},
                                          "credentials": {"tok": TOKEN_CAP, "db": DB_CAP}},
                               roles=ROLES)
        self.inv = tmp_path / "inv.yaml"
        self.a, self.b = users.name("a"), users.name("b")

    def secret(self, var: str, value: str | None = None) -> str:
        value = value or f"planted-{secrets.token_hex(12)}"
        self.monkeypatch.setenv(var, value)
        return value

    def configure(self, grants_a: dict | None = None, grants_b: dict | None = None,
                  **extra) -> None:
        agents = {"a": {"role": "worker", "user": self.a, "grants": grants_a or {}},
                  "b": {"role": "worker", "user": self.b, "grants": grants_b or {}}}
        write_inventory(self.inv, {"h": local_host(self.root, agents, **extra)})

    def run(self, *args: str):
        return cli(*args, inventory=self.inv, blueprint=self.bp)


def tok(var: str, repos=("acme/api",), permission="write") -> dict:
    return {"tok": {"scope": {"repos": list(repos), "permission": permission},
                    "secret": {"env": var}}}


@pytest.fixture
def fleet(tmp_path, host_root, real_users, monkeypatch):
    return Fleet(tmp_path, host_root, real_users, monkeypatch)


def as_user(user: str, *argv: str) -> subprocess.CompletedProcess:
    return subprocess.run(["runuser", "-u", user, "--", *argv], capture_output=True)


def grep_tree(top: Path, needle: bytes) -> list[str]:
    """Every file under ``top`` (following nothing) whose bytes contain ``needle``."""
    hits = []
    for dirpath, _dirs, files in os.walk(top):
        for name in files:
            path = os.path.join(dirpath, name)
            if os.path.islink(path) or not os.path.isfile(path):
                continue
            with open(path, "rb") as fh:
                if needle in fh.read():
                    hits.append(path)
    return hits


# -- rendering and bad input ------------------------------------------------------------------


def test_only_granted_capabilities_render_and_agent_yaml_names_the_directory(fleet):
    value = fleet.secret("TOK_A")
    fleet.configure(grants_a=tok("TOK_A"))
    from fleetctl.blueprint import load_blueprint
    from fleetctl.inventory import load_inventory
    from fleetctl.render import render_host

    bp = load_blueprint(fleet.bp)
    host = load_inventory(fleet.inv, blueprint=bp).hosts[0]
    tree = render_host(bp, host)
    creds = {p: tree.manifest.get(p) for p in tree.manifest.paths() if p.startswith("credentials")}
    assert set(creds) == {"credentials", "credentials/a", "credentials/a/tok.env"}
    assert (creds["credentials"].mode, creds["credentials"].owner) == ("0755", None)
    assert (creds["credentials/a"].mode, creds["credentials/a"].owner) == ("0700", f"{fleet.a}:{fleet.a}")
    f = creds["credentials/a/tok.env"]
    assert (f.mode, f.owner) == ("0600", f"{fleet.a}:{fleet.a}")
    import hashlib

    assert f.digest == "sha256:" + hashlib.sha256(token_file(value)).hexdigest()
    # The secret is held apart from ordinary content, and never in the release tree.
    assert f.digest not in tree.contents and tree.secrets[f.digest].reveal() == token_file(value)
    assert value not in repr(tree)
    config = {p: tree.contents[tree.manifest.get(p).digest] for p in
              ("agents/a/agent.yaml", "agents/b/agent.yaml")}
    assert config  # the default test agent template does not print credentials_dir; the real one:
    real = (Path(__file__).resolve().parents[2] / "templates" / "agent.yaml.j2").read_text()
    assert "credentials_dir: {{ agent.credentials_dir | tojson }}" in real


@pytest.mark.parametrize("grant,where,problem", [
    ({"tok": {"scope": {"repos": "acme/api", "permission": "write"}, "secret": {"env": "X"}}},
     "hosts.h.agents.a.grants.tok.scope.repos", "does not fit capability 'tok'"),
    ({"tok": {"scope": {"repos": ["acme/api"], "permission": "admin"}, "secret": {"env": "X"}}},
     "hosts.h.agents.a.grants.tok.scope.permission", "is not one of ['read', 'write']"),
    ({"nope": {"scope": {}, "secret": {"env": "X"}}},
     "hosts.h.agents.a.grants.nope", "no capability 'nope' in the blueprint"),
    ({"tok": {"scope": {"repos": ["a/b"], "permission": "read"}, "secret": "inline-value"}},
     "hosts.h.agents.a.grants.tok.secret", "secret source"),
])
def test_a_grant_that_does_not_fit_is_an_input_error_naming_file_line_and_key(
        fleet, grant, where, problem):
    fleet.configure(grants_a=grant)
    run = fleet.run("drift")
    assert run.code == 2 and "Traceback" not in run.stderr
    assert "inv.yaml:" in run.stderr and where in run.stderr and problem in run.stderr, run.stderr
    assert "inline-value" not in run.stderr + run.stdout


def test_a_capability_the_role_does_not_declare_is_refused(tmp_path, host_root, real_users,
                                                          monkeypatch):
    f = Fleet(tmp_path, host_root, real_users, monkeypatch)
    (f.bp / "roles" / "worker.yaml").write_text(yaml.safe_dump({"prompt": "w",
                                                                "capabilities": ["db"]}))
    f.configure(grants_a=tok("TOK_A"))
    run = f.run("drift")
    assert run.code == 2 and "role 'worker' does not declare capability 'tok'" in run.stderr


def test_an_unset_secret_names_its_source_and_nothing_is_written(fleet):
    fleet.monkeypatch.delenv("TOK_MISSING", raising=False)
    fleet.configure(grants_a=tok("TOK_MISSING"))
    run = fleet.run("ship", "--yes")
    assert run.code == 2 and "TOK_MISSING" in run.stdout + run.stderr
    assert not fleet.root.exists()


def test_a_template_error_never_quotes_the_secret(fleet):
    value = fleet.secret("TOK_A")
    (fleet.bp / "credentials" / "tok" / "tok.env.j2").write_text("T={{ {}[secret] }}\n")
    fleet.configure(grants_a=tok("TOK_A"))
    run = fleet.run("drift", "--debug")
    out = run.stdout + run.stderr
    # Jinja quotes the missing key, which is the secret: it is cut out of the message.
    assert run.code == 2 and "tok.env.j2:1" in out and "[redacted]" in out
    assert value not in out


# -- on the host: users, modes, isolation -------------------------------------------------------


def test_ship_creates_the_users_and_only_each_agent_reads_its_own_credentials(fleet):
    va, vb = fleet.secret("TOK_A"), fleet.secret("TOK_B")
    fleet.configure(grants_a=tok("TOK_A"), grants_b=tok("TOK_B", repos=("acme/web",)))
    run = fleet.run("ship", "--yes", "--format", "json")
    assert run.code == 0, run.stdout + run.stderr
    assert f"created user {fleet.a}" in run.host("h")["accounts"]
    creds = fleet.root / "credentials"
    for agent, user, value, repos in (("a", fleet.a, va, "acme/api"), ("b", fleet.b, vb, "acme/web")):
        pw = pwd.getpwnam(user)
        for path, mode in ((creds / agent, 0o700), (creds / agent / "tok.env", 0o600)):
            st = os.lstat(path)
            assert (stat.S_IMODE(st.st_mode), st.st_uid, st.st_gid) == (mode, pw.pw_uid, pw.pw_gid)
        assert (creds / agent / "tok.env").read_bytes() == token_file(value, repos)
        home = os.lstat(pw.pw_dir)
        assert pw.pw_dir == f"/home/{user}" and stat.S_IMODE(home.st_mode) == 0o700
        assert home.st_uid == pw.pw_uid
    assert stat.S_IMODE(os.lstat(creds).st_mode) == 0o755 and os.lstat(creds).st_uid == 0
    own = as_user(fleet.a, "cat", str(creds / "a" / "tok.env"))
    assert own.returncode == 0 and own.stdout == token_file(va)
    for reader in (fleet.a, "nobody"):
        other = as_user(reader, "cat", str(creds / "b" / "tok.env"))
        assert other.returncode != 0 and b"Permission denied" in other.stderr
        listing = as_user(reader, "ls", str(creds / "b"))
        assert listing.returncode != 0
    # Nothing secret inside any release, and drift is clean.
    assert grep_tree(fleet.root / "releases", va.encode()) == []
    assert fleet.run("drift").code == 0


def test_rotation_and_revocation_leave_no_copy_anywhere_under_the_root(fleet):
    old = fleet.secret("TOK_A")
    fleet.configure(grants_a=tok("TOK_A"), keep_releases=5)
    assert fleet.run("ship", "--yes").code == 0
    new = fleet.secret("TOK_A")
    drift = fleet.run("drift", "--format", "json")
    assert drift.code == 1
    (change,) = drift.host("h")["changes"]
    assert (change["path"], change["change"], change["origin"], change["secret"]) == (
        "credentials/a/tok.env", "content", "pending", True)
    assert "size" not in change["before"] and change["before"]["digest"].startswith("sha256:")
    assert old not in drift.stdout and new not in drift.stdout
    assert fleet.run("ship", "--yes").code == 0
    assert (fleet.root / "credentials" / "a" / "tok.env").read_bytes() == token_file(new)
    home = Path(pwd.getpwnam(fleet.a).pw_dir)
    for top in (fleet.root, home):
        assert grep_tree(top, old.encode()) == [], top
    # Revoke: the grant goes, so do the file and the agent's directory.
    fleet.configure(grants_a={}, keep_releases=5)
    run = fleet.run("ship", "--yes", "--format", "json")
    assert run.code == 0, run.stdout
    assert {c["path"] for c in run.host("h")["changes"]} == {
        "credentials", "credentials/a", "credentials/a/tok.env"}
    assert not (fleet.root / "credentials").exists()
    for top in (fleet.root, home):
        assert grep_tree(top, new.encode()) == [] and grep_tree(top, old.encode()) == []
    assert fleet.run("drift").code == 0


def test_a_watcher_never_sees_a_credential_wider_than_0600(fleet):
    fleet.secret("TOK_A")
    fleet.configure(grants_a=tok("TOK_A"))
    assert fleet.run("ship", "--yes").code == 0
    creds = fleet.root / "credentials"
    seen: dict[str, int] = {}
    wide: list[tuple[str, str]] = []
    stop = threading.Event()

    def watch() -> None:
        # Polls as fast as it can; any file it ever sees in an agent's directory (new files
        # included) must have no group/other bit, and the directory none either.
        while not stop.is_set():
            for agent_dir in (creds / "a", creds / "b"):
                try:
                    names = os.listdir(agent_dir)
                    dmode = stat.S_IMODE(os.lstat(agent_dir).st_mode)
                except OSError:
                    continue
                if dmode & 0o077:
                    wide.append((str(agent_dir), oct(dmode)))
                for name in names:
                    try:
                        mode = stat.S_IMODE(os.lstat(agent_dir / name).st_mode)
                    except OSError:
                        continue
                    seen[name] = seen.get(name, 0) + 1
                    if mode & 0o077:
                        wide.append((name, oct(mode)))

    thread = threading.Thread(target=watch, daemon=True)
    thread.start()
    try:
        for i in range(8):
            fleet.secret("TOK_A")
            fleet.secret("TOK_B")
            fleet.configure(grants_a=tok("TOK_A"), grants_b=tok("TOK_B") if i % 2 else {})
            assert fleet.run("ship", "--yes").code == 0
    finally:
        stop.set()
        thread.join()
    assert wide == []
    assert seen.get("tok.env", 0) > 0  # the watcher did look


def test_a_hand_patched_credential_is_drift_refused_then_forced(fleet):
    fleet.secret("TOK_A")
    fleet.configure(grants_a=tok("TOK_A"))
    assert fleet.run("ship", "--yes").code == 0
    path = fleet.root / "credentials" / "a" / "tok.env"
    os.chmod(path, 0o644)
    drift = fleet.run("drift", "--format", "json")
    (change,) = drift.host("h")["changes"]
    assert (change["change"], change["origin"], change["secret"]) == ("mode", "hand-patch", True)
    refused = fleet.run("ship", "--yes")
    assert refused.code == 3 and "credentials/a/tok.env" in refused.stdout
    assert fleet.run("ship", "--yes", "--force").code == 0
    assert stat.S_IMODE(os.lstat(path).st_mode) == 0o600


def test_permission_denied_while_writing_credentials_stops_with_the_old_release(fleet):
    old = fleet.secret("TOK_A")
    fleet.configure(grants_a=tok("TOK_A"))
    assert fleet.run("ship", "--yes").code == 0
    before = os.readlink(fleet.root / "current")
    agent_dir = fleet.root / "credentials" / "a"
    if subprocess.run(["chattr", "+i", str(agent_dir)], capture_output=True).returncode:
        pytest.skip("chattr +i is not supported on this filesystem")
    try:
        fleet.secret("TOK_A")
        run = fleet.run("ship", "--yes", "--format", "json")
    finally:
        subprocess.run(["chattr", "-i", str(agent_dir)], check=True)
    host = run.host("h")
    assert run.code == 2 and host["status"] == "error" and host["step"] == "credentials"
    assert str(agent_dir) in host["error"] and "not permitted" in host["error"].lower()
    assert os.readlink(fleet.root / "current") == before
    assert os.listdir(agent_dir) == ["tok.env"]  # nothing half-written, no leftovers
    assert (agent_dir / "tok.env").read_bytes() == token_file(old)


# -- no secret in anything fleetctl prints or writes -----------------------------------------


def test_planted_secrets_appear_in_no_output_report_file_or_trace(fleet, isolated_user):
    planted = [fleet.secret("TOK_A"), fleet.secret("TOK_B")]
    fleet.configure(grants_a=tok("TOK_A"), grants_b=tok("TOK_B"))
    outputs = []
    reports = fleet.tmp / "reports"
    reports.mkdir()
    for fmt in ("text", "json", "markdown"):
        outputs.append(fleet.run("ship", "--dry-run", "--format", fmt))
    outputs.append(fleet.run("ship", "--yes", "--format", "json", "--output",
                             str(reports / "ship.json")))
    # Rotate both, then look at the drift in every format.
    planted += [fleet.secret("TOK_A"), fleet.secret("TOK_B")]
    for fmt in ("text", "json", "markdown"):
        outputs.append(fleet.run("drift", "--format", fmt, "--output",
                                 str(reports / f"drift.{fmt}")))
    outputs.append(fleet.run("render", "h", "--out", str(fleet.tmp / "rendered")))
    outputs.append(fleet.run("ship", "--yes", "--format", "markdown"))
    # A forced failure with --debug: the credentials directory refuses the write.
    agent_dir = fleet.root / "credentials" / "a"
    planted.append(fleet.secret("TOK_A"))
    if subprocess.run(["chattr", "+i", str(agent_dir)], capture_output=True).returncode == 0:
        try:
            failed = fleet.run("ship", "--yes", "--debug")
            assert failed.code == 2
            outputs.append(failed)
        finally:
            subprocess.run(["chattr", "-i", str(agent_dir)], check=True)
    text = "".join(r.stdout + r.stderr for r in outputs)
    assert "credentials/a/tok.env" in text  # the reports did talk about the files
    for value in planted:
        assert value not in text
        for top in (reports, fleet.tmp / "rendered", isolated_user, fleet.bp,
                    fleet.root / ".fleetctl", fleet.root / "releases"):
            assert grep_tree(top, value.encode()) == [], (top, value[:8])
    assert not (fleet.tmp / "rendered" / "credentials").exists()
    # Credential digests live in root-only side records, never in the 0644 release records.
    records = (fleet.root / ".fleetctl" / "releases")
    side = list(records.glob("*.credentials.json"))
    main = [r for r in records.glob("*.json") if r not in side]
    assert side and main and len(side) == len(main)
    assert all(stat.S_IMODE(os.lstat(r).st_mode) == 0o600 and "credentials/a/tok.env" in r.read_text()
               for r in side)
    assert all(stat.S_IMODE(os.lstat(r).st_mode) == 0o644 and "credentials/" not in r.read_text()
               for r in main)


# -- over SSH ---------------------------------------------------------------------------------


def test_credentials_over_ssh_on_a_real_box(tmp_path, host_root, real_users, monkeypatch,
                                            sshd_pool, ssh_client_key, ssh_known_hosts):
    f = Fleet(tmp_path, host_root, real_users, monkeypatch)
    va, vb = f.secret("TOK_A"), f.secret("TOK_B")
    agents = {"a": {"role": "worker", "user": f.a, "grants": tok("TOK_A")},
              "b": {"role": "worker", "user": f.b, "grants": tok("TOK_B")}}
    write_inventory(f.inv, {"web1": ssh_host(sshd_pool[0], ssh_client_key, ssh_known_hosts,
                                             host_root, agents)})
    run = f.run("ship", "--yes", "--format", "json")
    assert run.code == 0, run.stdout + run.stderr
    assert va not in run.stdout and vb not in run.stdout
    creds = host_root / "credentials"
    assert (creds / "a" / "tok.env").read_bytes() == token_file(va)
    st = os.lstat(creds / "b" / "tok.env")
    assert stat.S_IMODE(st.st_mode) == 0o600 and st.st_uid == pwd.getpwnam(f.b).pw_uid
    assert as_user(f.a, "cat", str(creds / "b" / "tok.env")).returncode != 0
    assert f.run("drift").code == 0


def test_json_changes_of_credentials_carry_no_size(fleet):
    fleet.secret("TOK_A")
    fleet.configure(grants_a=tok("TOK_A"))
    dry = fleet.run("ship", "--dry-run", "--format", "json")
    changes = {c["path"]: c for c in dry.host("h")["changes"]}
    after = changes["credentials/a/tok.env"]["after"]
    assert changes["credentials/a/tok.env"]["secret"] is True
    assert set(after) == {"type", "mode", "owner", "digest"}
    assert changes["runner/run"]["secret"] is False and "size" in changes["runner/run"]["after"]
    json.dumps(dry.doc)


def test_the_example_inventories_fit_the_real_blueprint():
    """inventory/fleet.yaml and inventory/demo.yaml: every grant's scope fits its capability's
    schema and every granted capability is declared by the agent's role."""
    from fleetctl.blueprint import load_blueprint
    from fleetctl.inventory import load_inventory

    repo = Path(__file__).resolve().parents[2]
    bp = load_blueprint(repo / "blueprint")
    for name in ("fleet.yaml", "demo.yaml"):
        inv = load_inventory(repo / "inventory" / name, blueprint=bp)
        grants = {(a.name, g.capability) for h in inv.hosts for a in h.agents for g in a.grants}
        assert grants and all(c in bp.capabilities for _, c in grants)
    fleet = load_inventory(repo / "inventory" / "fleet.yaml", blueprint=bp)
    assert all(a.user for h in fleet.hosts for a in h.agents)  # production: each its own user


def test_a_leftover_of_an_interrupted_ship_is_removed_without_force(fleet):
    value = fleet.secret("TOK_A")
    fleet.configure(grants_a=tok("TOK_A"))
    assert fleet.run("ship", "--yes").code == 0
    leftover = fleet.root / "credentials" / "a" / ".fleetctl-new-tok.env"
    fd = os.open(leftover, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    os.write(fd, token_file(value))  # what a ship killed before its rename leaves
    os.close(fd)
    drift = fleet.run("drift", "--format", "json")
    (change,) = drift.host("h")["changes"]
    assert (change["path"], change["change"], change["origin"]) == (
        "credentials/a/.fleetctl-new-tok.env", "extra", "pending")
    assert fleet.run("ship", "--yes").code == 0  # no --force needed: it is fleetctl's own
    assert not leftover.exists() and os.listdir(leftover.parent) == ["tok.env"]


def test_a_changed_credential_is_refused_with_a_hint_that_fits_a_secret(fleet):
    fleet.secret("TOK_A")
    fleet.configure(grants_a=tok("TOK_A"))
    assert fleet.run("ship", "--yes").code == 0
    (fleet.root / "credentials" / "a" / "tok.env").write_bytes(b"TOKEN=edited-on-the-box\n")
    run = fleet.run("ship", "--yes", "--format", "json")
    host = run.host("h")
    assert run.code == 3 and host["status"] == "refused"
    assert "never backported" in host["hint"] and "--force" in host["hint"]
    assert "edited-on-the-box" not in run.stdout


def test_an_existing_user_whose_named_group_is_missing_gets_the_group(fleet):
    user = fleet.users.create("g")
    group = fleet.users.name("grp")
    fleet.secret("TOK_A")
    agents = {"a": {"role": "worker", "user": user, "group": group, "grants": tok("TOK_A")}}
    write_inventory(fleet.inv, {"h": local_host(fleet.root, agents)})
    plan = fleet.run("drift", "--format", "json")
    assert f"group of user {user} does not exist (ship creates it)" in plan.host("h")["accounts"]
    run = fleet.run("ship", "--yes", "--format", "json")
    assert run.code == 0, run.stdout
    assert f"created group {group} of {user}" in run.host("h")["accounts"]
    import grp

    st = os.lstat(fleet.root / "credentials" / "a" / "tok.env")
    assert st.st_gid == grp.getgrnam(group).gr_gid and st.st_uid == pwd.getpwnam(user).pw_uid
    assert fleet.run("drift").code == 0
    subprocess.run(["groupdel", group], capture_output=True)


def test_agents_sharing_a_user_must_agree_on_its_home(fleet):
    shared = fleet.users.name("s")
    agents = {"a": {"role": "worker", "user": shared},
              "b": {"role": "worker", "user": shared, "home": f"/home/{shared}-2"}}
    write_inventory(fleet.inv, {"h": local_host(fleet.root, agents)})
    run = fleet.run("drift")
    assert run.code == 2 and "hosts.h.agents.b.user" in run.stderr
    assert "must agree on group: and home:" in run.stderr


@pytest.mark.parametrize("home", ["/srv/a:b", "/srv/a\nb", "/srv/a b", "relative/home"])
def test_a_home_passwd_or_a_unit_would_misread_is_refused_at_load(fleet, home):
    write_inventory(fleet.inv, {"h": local_host(fleet.root, {
        "a": {"role": "worker", "user": fleet.a, "home": home}})})
    run = fleet.run("ship", "--yes")
    assert run.code == 2 and "hosts.h.agents.a.home" in run.stderr
    assert not fleet.root.exists()


def test_an_existing_user_with_another_home_stops_the_ship(fleet):
    user = fleet.users.create("e")  # HOME /home/<user> in /etc/passwd
    agents = {"a": {"role": "worker", "user": user, "home": f"/srv/{user}"}}
    write_inventory(fleet.inv, {"h": local_host(fleet.root, agents)})
    plan = fleet.run("drift", "--format", "json")
    (problem,) = plan.host("h")["accounts"]
    assert f"has HOME /home/{user} in /etc/passwd, not /srv/{user}" in problem
    run = fleet.run("ship", "--yes", "--format", "json")
    host = run.host("h")
    assert run.code == 2 and host["step"] == "users" and "/etc/passwd" in host["error"]
    assert not os.path.exists(f"/srv/{user}") and not (fleet.root / "current").exists()


@pytest.mark.parametrize("named", ["root", "alias"])
def test_an_agent_user_with_uid_0_stops_the_ship_before_any_account(fleet, named):
    """``user: root``, or a second uid-0 entry in /etc/passwd under another name: drift names
    it, ship and its dry run stop at the users step from the scan, with nothing sent and no root
    created (the host program refuses it too). The inventory still loads: the credentials audit
    reports ``root-user`` on it."""
    other = fleet.users.name("o")
    alias = fleet.users.name("uid0") if named == "alias" else "root"
    if named == "alias":
        subprocess.run(["useradd", "--non-unique", "--uid", "0", "--gid", "0",
                        "--no-create-home", "--shell", "/bin/sh", alias], check=True,
                       capture_output=True)
    try:
        agents = {"a": {"role": "worker", "user": other}, "b": {"role": "worker", "user": alias}}
        root = fleet.root / "new-root"  # a first ship: the root does not exist yet
        write_inventory(fleet.inv, {"h": local_host(root, agents)})
        plan = fleet.run("drift", "--format", "json")
        assert f"user {alias} has uid 0 in /etc/passwd" in "\n".join(plan.host("h")["accounts"])
        text = fleet.run("drift")
        # Agent a's user and HOME are missing; b's user exists, and a ship stops on it.
        assert "2 account(s) missing, 1 account problem(s) a ship stops on" in text.stdout
        dry = fleet.run("ship", "--dry-run", "--format", "json")
        assert dry.code == 2 and dry.host("h")["step"] == "users"
        run = fleet.run("ship", "--yes", "--format", "json")
        host = run.host("h")
        assert run.code == 2 and host["step"] == "users" and "/etc/passwd" in host["error"]
        assert f"user {alias} has uid 0" in host["error"] and host["sent_files"] == 0
        assert "previous release" not in (host["hint"] or "")
        # Stopped before any account was made (agent a's user was not created either), and
        # before anything was sent: the root it would have created is not there.
        assert other not in {p.pw_name for p in pwd.getpwall()}
        assert not root.exists()
    finally:
        if named == "alias":
            subprocess.run(["userdel", "--force", alias], capture_output=True)


def test_credential_templates_and_their_file_names_are_checked_when_the_blueprint_loads(
        tmp_path, host_root, real_users, monkeypatch):
    f = Fleet(tmp_path, host_root, real_users, monkeypatch)
    f.configure()  # no grant at all: the blueprint itself is wrong
    (f.bp / "credentials" / "db" / "db.env.j2").write_text("DB={{ secret }\n")
    run = f.run("drift")
    assert run.code == 2 and "credentials/db/db.env.j2:1: template syntax error" in run.stderr
    (f.bp / "credentials" / "db" / "db.env.j2").unlink()
    (f.bp / "credentials" / "db" / "tok.env.j2").write_text("DB={{ secret }}\n")
    run = f.run("drift")
    assert run.code == 2 and "worker.yaml" in run.stderr
    assert "both render 'tok.env'" in run.stderr


def test_a_secret_that_cannot_be_resolved_names_the_grant_and_its_source(fleet):
    """Drift without the secret: not an error any more (issue 11); the grant is named with
    its inventory line and its source, and so is the ship's refusal."""
    fleet.monkeypatch.delenv("TOK_GONE", raising=False)
    fleet.configure(grants_a=tok("TOK_GONE"))
    run = fleet.run("drift")
    assert run.code == 1, run.stdout + run.stderr
    assert "inv.yaml:" in run.stdout and "hosts.h.agents.a.grants.tok" in run.stdout
    assert "environment variable TOK_GONE" in run.stdout
    shipped = fleet.run("ship", "--yes")
    assert shipped.code == 2
    assert "hosts.h.agents.a.grants.tok" in shipped.stdout
    assert "environment variable TOK_GONE" in shipped.stdout


def test_homes_of_different_users_may_not_overlap_or_climb(fleet):
    agents = {"a": {"role": "worker", "user": fleet.a, "home": "/srv/agents/a"},
              "b": {"role": "worker", "user": fleet.b, "home": "/srv/agents/a/b"}}
    write_inventory(fleet.inv, {"h": local_host(fleet.root, agents)})
    run = fleet.run("drift")
    assert run.code == 2 and "hosts.h.agents.b.home" in run.stderr and "overlaps" in run.stderr
    agents["b"]["home"] = "/srv/agents/../b"
    write_inventory(fleet.inv, {"h": local_host(fleet.root, agents)})
    run = fleet.run("drift")
    assert run.code == 2 and "hosts.h.agents.b.home" in run.stderr


def test_a_home_that_is_a_symlink_stops_the_ship_and_its_target_is_untouched(fleet, tmp_path):
    target = Path(tempfile.mkdtemp(prefix="fleetctl-victim-"))
    try:
        os.chmod(target, 0o755)
        home = Path(tempfile.mkdtemp(prefix="fleetctl-homes-")) / "h"
        home.symlink_to(target)
        fleet.secret("TOK_A")
        write_inventory(fleet.inv, {"h": local_host(fleet.root, {
            "a": {"role": "worker", "user": fleet.a, "home": str(home), "grants": tok("TOK_A")}})})
        run = fleet.run("ship", "--yes", "--format", "json")
        host = run.host("h")
        assert run.code == 2 and host["step"] == "users" and "not a directory" in host["error"]
        st = os.lstat(target)
        assert (st.st_uid, stat.S_IMODE(st.st_mode)) == (0, 0o755)
        assert not (fleet.root / "current").exists()
    finally:
        shutil.rmtree(target, ignore_errors=True)
        shutil.rmtree(home.parent, ignore_errors=True)


def test_what_an_agent_plants_in_its_own_directory_is_seen_and_never_followed(fleet):
    """The agent owns credentials/<agent>/: links and subdirectories it plants there show in
    drift (``.fleetignore`` does not apply under credentials/), are refused without --force,
    and a forced ship replaces them without following any link or touching its target."""
    (fleet.bp / ".fleetignore").write_text("__pycache__/\n*.pyc\n")
    from tests.helpers import git as run_git

    run_git(fleet.bp, "add", "-A")
    run_git(fleet.bp, "commit", "-q", "-m", "ignore")
    value = fleet.secret("TOK_A")
    fleet.configure(grants_a=tok("TOK_A"))
    assert fleet.run("ship", "--yes").code == 0
    victim_dir = Path(tempfile.mkdtemp(prefix="fleetctl-victim-"))
    try:
        victim = victim_dir / "shadow"
        victim.write_text("root's file\n")
        os.chmod(victim, 0o640)
        agent_dir = fleet.root / "credentials" / "a"
        uid = pwd.getpwnam(fleet.a).pw_uid
        (agent_dir / "tok.env").unlink()
        os.symlink(victim, agent_dir / "tok.env")  # as if the agent did it
        os.lchown(agent_dir / "tok.env", uid, uid)
        (agent_dir / "__pycache__" / "d").mkdir(parents=True)
        (agent_dir / "__pycache__" / "d" / "f.pyc").write_text("x")
        os.symlink(victim_dir, agent_dir / "link-to-dir")
        drift = fleet.run("drift", "--format", "json")
        paths = {c["path"]: (c["change"], c["origin"]) for c in drift.host("h")["changes"]}
        assert paths["credentials/a/tok.env"] == ("type", "hand-patch")
        assert paths["credentials/a/__pycache__/d/f.pyc"][0] == "extra"
        assert paths["credentials/a/link-to-dir"][0] == "extra"
        assert fleet.run("ship", "--yes").code == 3
        forced = fleet.run("ship", "--yes", "--force")
        assert forced.code == 0, forced.stdout
        assert sorted(os.listdir(agent_dir)) == ["tok.env"]
        assert (agent_dir / "tok.env").read_bytes() == token_file(value)
        assert victim.read_text() == "root's file\n" and stat.S_IMODE(os.lstat(victim).st_mode) == 0o640
        assert os.lstat(victim).st_uid == 0 and sorted(os.listdir(victim_dir)) == ["shadow"]
        st = os.lstat(agent_dir)
        assert (st.st_uid, stat.S_IMODE(st.st_mode)) == (uid, 0o700)  # given back to the agent
    finally:
        shutil.rmtree(victim_dir, ignore_errors=True)


def test_a_fifo_swapped_in_never_hangs_the_scan():
    """The host-side hash opens without blocking and refuses what is no longer a plain file."""
    from fleetctl.host.walk import file_digest

    top = Path(tempfile.mkdtemp(prefix="fleetctl-fifo-"))
    try:
        os.mkfifo(top / "f")
        done = {}

        def digest():
            try:
                file_digest(os.fsencode(top / "f"))
            except OSError as exc:
                done["error"] = exc

        thread = threading.Thread(target=digest, daemon=True)
        thread.start()
        thread.join(5)
        assert not thread.is_alive() and "error" in done
    finally:
        shutil.rmtree(top, ignore_errors=True)


def test_the_host_program_carries_the_shared_protocol_module():
    """The leftover prefix (and every other shared rule) is defined once, in fleetctl.protocol:
    the host program imports that module, and the payload sent to a host holds its source."""
    from fleetctl import bundle, protocol
    from fleetctl.host import credentials as host_credentials

    sources = bundle.host_sources()
    assert sources["fleetctl.protocol"] == (False, Path(protocol.__file__).read_text())
    assert "from fleetctl import protocol" in sources["fleetctl.host.credentials"][1]
    assert host_credentials.CREDS_NEW == b".fleetctl-new-"

"""Errors an operator meets (issue 11), each naming the host and the file, line or setting, with
no traceback: a malformed known_hosts line (skipped with file:line, as OpenSSH does, so hosts
whose own entries are fine still work), a missing known_hosts file, a missing identity file, a
port that does not speak SSH; and the blueprint found next to the inventory, not in the current
directory.

Real sshd boxes, a real HTTP server on the "wrong" port, fleetctl run as a real subprocess where
what reaches the terminal matters (paramiko's logging), real git repositories.
"""

from __future__ import annotations

import http.server
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from tests.helpers import cli, local_host, make_project, ssh_host, write_inventory
from tests.sshd_boxes import write_known_hosts

BLUEPRINT = {"runner": {"run.sh": "#!/bin/sh\necho run\n", "README": "the runner\n"}}


def fleetctl(*args: str, cwd: Path, env: dict | None = None) -> subprocess.CompletedProcess:
    """Run fleetctl as the operator does: a process of its own, its stderr as the terminal gets
    it (paramiko's logging included)."""
    return subprocess.run([sys.executable, "-m", "fleetctl", *args], cwd=cwd, capture_output=True,
                          text=True, timeout=120, env={**os.environ, **(env or {})})


def broken_line(box) -> str:
    """The box's known_hosts line with its base64 key cut short (bad padding)."""
    names, kind, key = box.known_hosts_line().split()
    return f"{names} {kind} {key[:-3]}"



def _drift_two_boxes(tmp_path, sshd_pool, key, known, bp):
    """``fleetctl drift --format json`` over hosts web1 and web2 (the pool's first two boxes,
    roots r1 and r2) with the known_hosts file ``known``: ``(inventory, run)``."""
    inv = write_inventory(tmp_path / "inv.yaml", {
        "web1": ssh_host(sshd_pool[0], key, known, tmp_path / "r1"),
        "web2": ssh_host(sshd_pool[1], key, known, tmp_path / "r2")})
    return inv, cli("drift", "--format", "json", inventory=inv, blueprint=bp)

def test_a_malformed_known_hosts_line_is_skipped_with_file_and_line(tmp_path, sshd_pool,
                                                                    ssh_client_key):
    """known_hosts: line 1 a comment, line 2 box0 fine, line 3 box1's key damaged. web1
    (box0) is scanned as usual, with a warning naming FILE:3; web2 (box1) stops with an error
    naming itself, the file and line 3; no "internal error", no traceback. (Before: both hosts
    were "internal error ... Incorrect padding".)"""
    bp = make_project(tmp_path, BLUEPRINT)
    known = tmp_path / "known_hosts"
    known.write_text(f"# fleet hosts\n{sshd_pool[0].known_hosts_line()}\n"
                     f"{broken_line(sshd_pool[1])}\n")
    inv, run = _drift_two_boxes(tmp_path, sshd_pool, ssh_client_key, known, bp)
    assert run.code == 2, run.stdout + run.stderr
    web1, web2 = run.host("web1"), run.host("web2")
    assert web1["status"] == "drift", web1  # never shipped: reached and scanned
    assert any(w.startswith(f"{known}:3: malformed key") and "line skipped" in w
               for w in web1["warnings"]), web1["warnings"]
    assert web2["status"] == "error"
    assert web2["error"].startswith("web2: ")
    assert f"is not in {known}" in web2["error"] and f"{known}:3: malformed key" in web2["error"]
    for text in (web1["error"] or "", web2["error"], run.stderr):
        assert "internal error" not in text and "Traceback" not in text
    text = cli("drift", inventory=inv, blueprint=bp)
    assert f"warning: {known}:3: malformed key" in text.stdout


def test_a_missing_known_hosts_file_is_named(tmp_path, sshd_pool, ssh_client_key, isolated_user):
    """The inventory's known_hosts that does not exist, and the default ~/.ssh/known_hosts when
    the inventory names none: each is an error naming the host, the file and that it does not
    exist (before: "is not in FILE", as if the file were there but empty)."""
    bp = make_project(tmp_path, BLUEPRINT)
    absent = tmp_path / "nowhere" / "known_hosts"
    spec = ssh_host(sshd_pool[0], ssh_client_key, absent, tmp_path / "r1")
    default = dict(spec)
    del default["known_hosts"]
    for name, host, path in (("named", spec, absent),
                             ("default", default, isolated_user / ".ssh" / "known_hosts")):
        inv = write_inventory(tmp_path / f"inv-{name}.yaml", {"web1": host})
        run = cli("drift", "--format", "json", inventory=inv, blueprint=bp)
        assert run.code == 2, run.stdout + run.stderr
        error = run.host("web1")["error"]
        assert error.startswith("web1: ") and f"known_hosts file {path}" in error, error
        assert "does not exist" in error, error
        assert not path.exists()


def test_a_missing_identity_file_is_named(tmp_path, sshd_pool, ssh_known_hosts, ssh_client_key):
    """identity_file pointing at nothing: the error names the host, the setting and the file
    (before: "cannot reach root@...: No such file or directory", no file named); nothing is
    written on the host."""
    bp = make_project(tmp_path, BLUEPRINT)
    missing = tmp_path / "keys" / "id_missing"
    spec = ssh_host(sshd_pool[0], ssh_client_key, ssh_known_hosts, tmp_path / "r1")
    spec["identity_file"] = str(missing)
    inv = write_inventory(tmp_path / "inv.yaml", {"web1": spec})
    for args in (("drift",), ("ship", "--yes")):
        run = cli(*args, "--format", "json", inventory=inv, blueprint=bp)
        assert run.code == 2, run.stdout + run.stderr
        error = run.host("web1")["error"]
        assert error == f"web1: identity_file {missing} (the inventory's identity_file:) does " \
                        "not exist", error
    assert not (tmp_path / "r1").exists()


@pytest.fixture
def http_port():
    """A real HTTP server on 127.0.0.1 (a port that does not speak SSH); stopped afterwards."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), http.server.BaseHTTPRequestHandler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server.server_address[1]
    finally:
        server.shutdown()
        server.server_close()


def test_a_port_that_does_not_speak_ssh(tmp_path, http_port, ssh_client_key, ssh_known_hosts,
                                        sshd_pool):
    """An HTTP server where the inventory says SSH: exit 2, one line naming the host, address
    and port and "does not speak SSH"; nothing of paramiko's traceback on the terminal."""
    bp = make_project(tmp_path, BLUEPRINT)
    spec = ssh_host(sshd_pool[0], ssh_client_key, ssh_known_hosts, tmp_path / "r1")
    spec["port"] = http_port
    inv = write_inventory(tmp_path / "inv.yaml", {"web1": spec})
    done = fleetctl("drift", "-i", str(inv), "-b", str(bp), "--timeout", "20", cwd=tmp_path)
    assert done.returncode == 2, done.stdout + done.stderr
    assert f"web1: error: 127.0.0.1:{http_port} does not speak SSH" in done.stdout, done.stdout
    assert "Traceback" not in done.stderr + done.stdout, done.stderr
    assert "paramiko" not in done.stderr + done.stdout, done.stderr
    assert "internal error" not in done.stdout


def test_the_blueprint_is_found_next_to_the_inventory_from_any_directory(tmp_path):
    """``fleetctl drift -i /path/to/fleet/inventory/x.yaml`` from an unrelated directory (and
    ship, creds audit, tokens): the blueprint and templates of that repository are used
    (before: "blueprint/: blueprint directory not found")."""
    fleet = tmp_path / "fleet"
    (fleet / "inventory").mkdir(parents=True)
    make_project(fleet, BLUEPRINT, executable=("runner/run.sh",))
    inv = write_inventory(fleet / "inventory" / "x.yaml",
                          {"h1": local_host(tmp_path / "box")})
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    first = fleetctl("drift", "-i", str(inv), "--format", "json", cwd=elsewhere)
    assert first.returncode == 1, first.stdout + first.stderr
    import json

    paths = {c["path"] for c in json.loads(first.stdout)["hosts"][0]["changes"]}
    assert {"runner/run.sh", "runner/README", "agents/w1/agent.yaml"} <= paths
    shipped = fleetctl("ship", "--yes", "-i", str(inv), cwd=elsewhere)
    assert shipped.returncode == 0, shipped.stdout + shipped.stderr
    assert (tmp_path / "box" / "current" / "runner" / "README").read_text() == "the runner\n"
    # The agent config came from the repository's own templates/.
    assert (tmp_path / "box" / "current" / "agents" / "w1" / "agent.yaml").read_text() == \
        "agent: w1\nrole: worker\n"
    assert fleetctl("drift", "-i", str(inv), cwd=elsewhere).returncode == 0
    # Through the environment variable, and for the other commands loading the same way.
    env = {"FLEETCTL_INVENTORY": str(inv)}
    assert fleetctl("drift", cwd=elsewhere, env=env).returncode == 0
    audit = fleetctl("creds", "audit", "--static", "-i", str(inv), cwd=elsewhere)
    assert audit.returncode in (0, 1), audit.stdout + audit.stderr
    assert "blueprint directory not found" not in audit.stderr
    # tokens needs the real runner to measure with; this blueprint has none, and the error
    # says so about the repository's own blueprint (not "not found" in the current directory).
    tokens = fleetctl("tokens", "-i", str(inv), "--format", "json", cwd=elsewhere)
    assert f"{fleet / 'blueprint' / 'runner'}" in tokens.stderr, tokens.stderr


def test_hashed_known_hosts_lines_still_work_beside_a_bad_one(tmp_path, sshd_pool,
                                                              ssh_client_key):
    """known_hosts hashed by ``ssh-keygen -H`` (as many distributions do by default) with one
    bad line after it: the hashed entry is found, the bad line is a warning."""
    bp = make_project(tmp_path, BLUEPRINT)
    known = write_known_hosts(tmp_path / "known_hosts", [sshd_pool[0]])
    subprocess.run(["ssh-keygen", "-q", "-H", "-f", str(known)], check=True, capture_output=True)
    hashed = known.read_text()
    assert hashed.startswith("|1|") and "127.0.0.1" not in hashed
    known.write_text(hashed + "just-one-field\n")
    inv = write_inventory(tmp_path / "inv.yaml", {
        "web1": ssh_host(sshd_pool[0], ssh_client_key, known, tmp_path / "r1")})
    run = cli("drift", "--format", "json", inventory=inv, blueprint=bp)
    assert run.code == 1, run.stdout + run.stderr
    assert run.host("web1")["warnings"] == [
        f"{known}:2: not a known_hosts line (want: HOSTS KEYTYPE BASE64-KEY); line skipped"]


def test_a_missing_key_file_named_by_the_ssh_config_is_named(tmp_path, sshd_pool,
                                                             ssh_known_hosts, ssh_client_key,
                                                             isolated_user):
    """No identity_file in the inventory, but ~/.ssh/config names an IdentityFile that does not
    exist: the error names the host and that file (before: no file named)."""
    bp = make_project(tmp_path, BLUEPRINT)
    missing = tmp_path / "keys" / "id_from_config"
    (isolated_user / ".ssh").mkdir(exist_ok=True)
    (isolated_user / ".ssh" / "config").write_text(
        f"Host 127.0.0.1\n  IdentityFile {missing}\n  IdentitiesOnly yes\n")
    spec = ssh_host(sshd_pool[0], ssh_client_key, ssh_known_hosts, tmp_path / "r1")
    del spec["identity_file"]
    inv = write_inventory(tmp_path / "inv.yaml", {"web1": spec})
    run = cli("drift", "--format", "json", inventory=inv, blueprint=bp)
    assert run.code == 2, run.stdout + run.stderr
    error = run.host("web1")["error"]
    assert error.startswith("web1: ") and str(missing) in error, error


def test_a_revoked_key_is_refused_even_where_another_line_lists_it(tmp_path, sshd_pool,
                                                                   ssh_client_key):
    """``@revoked`` is honoured as OpenSSH does: box0's key listed for it on line 1 and marked
    ``@revoked`` on line 2 stops web1 with an error naming the revoking line; box1 (listed,
    not revoked) works; a ``@cert-authority`` line is skipped with a warning. (Before: the
    marker lines made every host an internal error.)"""
    bp = make_project(tmp_path, BLUEPRINT)
    key0 = sshd_pool[0].host_key_pub
    known = tmp_path / "known_hosts"
    known.write_text(f"{sshd_pool[0].known_hosts_line()}\n@revoked * {key0}\n"
                     f"{sshd_pool[1].known_hosts_line()}\n@cert-authority *.example {key0}\n")
    inv, run = _drift_two_boxes(tmp_path, sshd_pool, ssh_client_key, known, bp)
    assert run.code == 2, run.stdout + run.stderr
    web1, web2 = run.host("web1"), run.host("web2")
    assert web1["status"] == "error"
    assert f"is marked @revoked in {known}:2; refusing to connect" in web1["error"], web1
    assert web2["status"] == "drift"
    assert web2["warnings"] == [
        f"{known}:4: marker @cert-authority is not supported by fleetctl; line skipped"]
    assert not (tmp_path / "r1").exists()


def test_a_command_without_inventory_says_which_inventory_it_read(tmp_path):
    """Without ``--inventory`` every command says, in one stderr line, which inventory file it
    read and how to choose another; from ``$FLEETCTL_INVENTORY`` it says so; with
    ``--inventory`` it says nothing (the user named it). Before: nothing was said, and a user
    who forgot ``-i`` read the demo fleet's drift as their own."""
    fleet = tmp_path / "fleet"
    (fleet / "inventory").mkdir(parents=True)
    make_project(fleet, BLUEPRINT, executable=("runner/run.sh",))
    demo = write_inventory(fleet / "inventory" / "demo.yaml", {"h1": local_host(tmp_path / "b1")})
    other = write_inventory(tmp_path / "other.yaml", {"h2": local_host(tmp_path / "b2")})
    default_line = ("inventory: inventory/demo.yaml (default; --inventory or "
                    "$FLEETCTL_INVENTORY to change)")
    env = {k: v for k, v in os.environ.items() if k != "FLEETCTL_INVENTORY"}
    for argv in (("drift",), ("ship", "--dry-run"), ("creds", "audit", "--static"),
                 ("history",), ("releases", "h1")):
        done = subprocess.run([sys.executable, "-m", "fleetctl", *argv], cwd=fleet,
                              capture_output=True, text=True, timeout=120, env=env)
        lines = done.stderr.splitlines()
        assert lines.count(default_line) == 1, (argv, done.stderr)
        assert str(demo) not in done.stdout, (argv, done.stdout)
    from_env = fleetctl("drift", cwd=fleet, env={"FLEETCTL_INVENTORY": str(other)})
    assert f"inventory: {other} (from $FLEETCTL_INVENTORY)" in from_env.stderr.splitlines(), \
        from_env.stderr
    named = fleetctl("drift", "-i", str(other), cwd=fleet)
    assert "inventory:" not in named.stderr, named.stderr

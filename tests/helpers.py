"""Test helpers: blueprints and inventories built from dict specs, the CLI run in-process, and
an independent snapshot of a tree (plain os.lstat + hashlib, none of fleetctl's code)."""

from __future__ import annotations

import hashlib
import json
import os
import stat
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import yaml
from typer.testing import CliRunner

from fleetctl.cli import app

AGENT_TEMPLATE = "agent: {{ agent.name }}\nrole: {{ agent.role }}\n"


def sudoers_args() -> str:
    """``-c BOOTSTRAP`` as a sudoers command argument: backslash, comma, colon and equals sign
    escaped with a backslash (sudoers(5)); built here, independently of fleetctl's helper."""
    from fleetctl.bundle import BOOTSTRAP

    args = "-c " + BOOTSTRAP
    for char in ("\\", ",", ":", "="):
        args = args.replace(char, "\\" + char)
    return args


@dataclass(frozen=True)
class Symlink:
    """A symlink in a tree spec."""

    target: str


WAIT_S = 60.0
"""Seconds a test waits for a condition before failing: far more than any passing test needs even
on a machine whose cores are all busy, so a slow machine is never read as a bug."""


def wait_until(predicate: Callable[[], Any], timeout_s: float = WAIT_S, poll_s: float = 0.02,
               what: str | None = None) -> Any:
    """Poll ``predicate()`` every ``poll_s`` seconds until it returns a true value; return it.

    Raises:
        AssertionError: still false after ``timeout_s`` seconds (message: ``what`` or the
            predicate's repr).
    """
    deadline = time.monotonic() + timeout_s
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise AssertionError(f"not true within {timeout_s:g} s: {what or predicate!r}")
        time.sleep(poll_s)


def git(repo: Path, *args: str) -> str:
    """Run git in ``repo`` and return stdout (raises on failure)."""
    env = {**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@example.invalid",
           "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@example.invalid"}
    done = subprocess.run(["git", "-C", str(repo), *args], capture_output=True, check=True, env=env)
    return done.stdout.decode()


def build_tree(root: Path | bytes, spec: dict) -> None:
    """Create files (str/bytes values), directories (dict values) and symlinks under ``root``.

    Keys may be ``str`` or ``bytes`` (for names that are not valid UTF-8).
    """
    root_b = os.fsencode(root)
    os.makedirs(root_b, exist_ok=True)
    for name, value in spec.items():
        path = os.path.join(root_b, os.fsencode(name))
        if isinstance(value, dict):
            build_tree(path, value)
        elif isinstance(value, Symlink):
            os.symlink(os.fsencode(value.target), path)
        else:
            os.makedirs(os.path.dirname(path), exist_ok=True)
            with open(path, "wb") as fh:
                fh.write(value.encode() if isinstance(value, str) else value)


def make_project(base: Path, files: dict, roles: dict[str, dict] | None = None,
                 executable: tuple[str, ...] = (), attributes: dict | None = None,
                 agent_template: str = AGENT_TEMPLATE, use_git: bool = True,
                 fleetignore: str | None = None) -> Path:
    """Create ``base/blueprint`` and ``base/templates``, committed in a git repository at
    ``base`` unless ``use_git`` is false (the repository ignores everything else under ``base``:
    inventories and boxes tests put there are no part of the source).

    Args:
        files: tree spec under ``blueprint/`` (e.g. ``{"runner": {"run.sh": "..."}}``).
        roles: role name → role dict; default one role ``worker`` using no skills.
        executable: blueprint-relative paths whose git index mode is 100755.
    Returns the blueprint directory.
    """
    bp = base / "blueprint"
    build_tree(bp, files)
    (bp / "roles").mkdir(exist_ok=True)
    for name, body in (roles or {"worker": {"prompt": "work"}}).items():
        (bp / "roles" / f"{name}.yaml").write_text(yaml.safe_dump(body))
    if attributes is not None:
        (bp / "attributes.yaml").write_text(yaml.safe_dump(attributes))
    if fleetignore is not None:
        (bp / ".fleetignore").write_text(fleetignore)
    (base / "templates").mkdir(exist_ok=True)
    (base / "templates" / "agent.yaml.j2").write_text(agent_template)
    if use_git:
        commit_project(base, executable)
    return bp


def commit_project(base: Path, executable: tuple[str, ...] = ()) -> None:
    """Make ``base`` a git repository holding ``blueprint/`` and ``templates/`` (everything else
    under ``base`` ignored) and commit them, as a clean fleet checkout would be.

    Args:
        executable: blueprint-relative paths whose git index mode is 100755.
    """
    bp = base / "blueprint"
    (base / ".gitignore").write_text("/*\n!/.gitignore\n!/blueprint/\n!/templates/\n")
    git(base, "init", "-q")
    git(base, "add", "-A")
    for rel in executable:
        os.chmod(bp / rel, 0o755)  # as a real checkout would have it, so later adds keep it
        git(bp, "update-index", "--chmod=+x", rel)
    git(base, "commit", "-q", "-m", "blueprint")


def write_inventory(path: Path, hosts: dict[str, dict], defaults: dict | None = None) -> Path:
    """Write an inventory YAML file and return its path."""
    body: dict[str, Any] = {"hosts": hosts}
    if defaults:
        body["defaults"] = defaults
    path.write_text(yaml.safe_dump(body))
    return path


def local_host(root: Path, agents: dict | None = None, **extra: Any) -> dict:
    """An inventory host dict for a local box at ``root``."""
    return {"transport": "local", "root": str(root),
            "agents": agents if agents is not None else {"w1": {"role": "worker"}}, **extra}


def ssh_host(box, key, known_hosts: Path, root: Path, agents: dict | None = None,
             **extra: Any) -> dict:
    """An inventory host dict for an sshd test box, as root with the test key."""
    return {"transport": "ssh", "address": "127.0.0.1", "port": box.port, "user": "root",
            "identity_file": str(key.private_key), "known_hosts": str(known_hosts),
            "root": str(root), "agents": agents if agents is not None else
            {"w1": {"role": "worker"}}, **extra}


@dataclass
class Run:
    """One CLI run: exit code, stdout, stderr, and stdout parsed as JSON when it is JSON."""

    code: int
    stdout: str
    stderr: str

    @property
    def doc(self) -> dict:
        return json.loads(self.stdout)

    def host(self, name: str) -> dict:
        return next(h for h in self.doc["hosts"] if h["host"] == name)


def cli(*args: str, inventory: Path | None = None, blueprint: Path | None = None) -> Run:
    """Run ``fleetctl ARGS`` in-process with typer's CliRunner (stdin is not a terminal)."""
    argv = list(args)
    if inventory is not None:
        argv += ["--inventory", str(inventory)]
    if blueprint is not None:
        argv += ["--blueprint", str(blueprint)]
    result = CliRunner().invoke(app, argv, catch_exceptions=False)
    return Run(result.exit_code, result.stdout, result.stderr)


def snapshot(root: Path | bytes) -> dict[bytes, tuple]:
    """Describe every node under ``root`` independently of fleetctl: relative path (bytes) →
    (type, mode bits, uid, gid, sha256 hex or link target, inode)."""
    out = {}
    root_b = os.fsencode(root)
    for dirpath, dirnames, filenames in os.walk(root_b):
        for name in dirnames + filenames:
            full = os.path.join(dirpath, name)
            st = os.lstat(full)
            rel = os.path.relpath(full, root_b)
            if stat.S_ISLNK(st.st_mode):
                out[rel] = ("symlink", None, st.st_uid, st.st_gid, os.readlink(full), st.st_ino)
            elif stat.S_ISDIR(st.st_mode):
                out[rel] = ("dir", stat.S_IMODE(st.st_mode), st.st_uid, st.st_gid, None, st.st_ino)
            else:
                with open(full, "rb") as fh:
                    digest = hashlib.sha256(fh.read()).hexdigest()
                out[rel] = ("file", stat.S_IMODE(st.st_mode), st.st_uid, st.st_gid, digest,
                            st.st_ino)
    return out


def without_inodes(snap: dict) -> dict:
    """A snapshot without inode numbers, for comparing content and attributes only."""
    return {k: v[:5] for k, v in snap.items()}


def changes_of(run: Run, host: str) -> set[tuple[str, str, str]]:
    """The ``(path, change, origin)`` triples of one host in a JSON drift/ship run."""
    return {(c["path"], c["change"], c["origin"]) for c in run.host(host)["changes"]}


class RealUsers:
    """Real Linux users for a test (tests run as root), each removed with its HOME afterwards.

    ``name(tag)`` gives a unique, valid user name not yet on this machine (it is created only if
    the test, or a ship under test, creates it); ``create(tag)`` also creates it now.
    """

    def __init__(self) -> None:
        import secrets as _secrets

        self._prefix = "ft" + _secrets.token_hex(3)
        self.names: list[str] = []

    def name(self, tag: str) -> str:
        name = f"{self._prefix}-{tag}"[:32]
        if name not in self.names:
            self.names.append(name)
        return name

    def create(self, tag: str, home: str | None = None) -> str:
        import subprocess

        name = self.name(tag)
        args = ["useradd", "--user-group", "--shell", "/bin/sh"]
        args += ["--create-home", "--home-dir", home] if home else ["--create-home"]
        subprocess.run([*args, name], check=True, capture_output=True)
        return name

    def cleanup(self) -> None:
        import pwd
        import shutil
        import subprocess

        for name in self.names:
            try:
                home = pwd.getpwnam(name).pw_dir
            except KeyError:
                continue
            subprocess.run(["userdel", "-r", name], capture_output=True)
            if home.startswith("/home/") and os.path.isdir(home):
                shutil.rmtree(home, ignore_errors=True)
            subprocess.run(["groupdel", name], capture_output=True)

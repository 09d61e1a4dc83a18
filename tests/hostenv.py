"""The environment matrix: real sshd boxes whose login is not the tidy one tests usually get.

A host's login environment must never change what fleetctl does (docs/layout.md, modes;
docs/design.md, the first frame). Each :class:`LoginEnv` in :data:`MATRIX` is one named way a
real host differs, taken from public bug reports of tools that met it:

- ``umask-077``/``umask-027`` in the login's rc files (ansible/ansible#11764 and #2998: mkdir
  -p under a strict umask left parents unreadable), ``umask-002`` (deployphp/deployer#1977: a
  user-private-group umask from /etc/profile), ``sshd-umask-077`` (sshd itself started with it:
  every session inherits it, with ``UsePAM no`` nothing resets it);
- ``noisy-rc``: ``.bashrc`` printing on stdout (with and without a newline, and a forged
  event line) and stderr (rust-lang/rustup#498, chriskempson/base16-shell#40: "protocol version
  mismatch -- is your shell clean?");
- ``locale-de-missing``: LANG/LC_ALL name a locale that is not installed; ``locale-latin1``: a
  real ISO-8859-1 locale (generated with localedef, found through LOCPATH), where Python's file
  system encoding is latin-1;
- ``python-elsewhere``: no ``python3`` on the login's PATH; the inventory's ``python:`` names
  the interpreter;
- ``noexec-tmp``: TMPDIR on a tmpfs mounted ``noexec`` (ansible/ansible#1609, #22203).

Each box is its own sshd (``tests.sshd_boxes``), each login its own Linux user with ``/bin/bash``
as shell (Debian's bash sources ``~/.bashrc`` for a command run over ssh) and the variant's
lines in ``~/.bashrc`` and ``~/.profile``; the managed root is ``<HOME>/fleet/box`` (its parent
is made by the first ship). Use::

    @pytest.mark.parametrize("env", MATRIX, ids=str)
    def test_something(env, env_hosts):
        host = env_hosts(env)          # an EnvHost: box, user, root, inventory entry
        inv = write_inventory(tmp_path / "inv.yaml", {"h": host.inventory()})

To add a variant (sudo ones are expected), append a :class:`LoginEnv` to :data:`MATRIX`; its
``setup`` hook runs as root after the user and box exist and may write files, sudoers lines,
anything, and ``inventory`` adds keys to the host's inventory entry.
"""

from __future__ import annotations

import atexit
import os
import pwd
import secrets
import shutil
import stat
import subprocess
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from tests.helpers import ssh_host, sudoers_args, wait_until
from tests.sshd_boxes import ClientKey, SshdBox, write_known_hosts

#: A blueprint's files for the matrix's tests: an executable, a nested directory and a name
#: that is not ASCII (its bytes on the host are its UTF-8 bytes, whatever the host's locale).
FILES = {"runner": {"run.sh": "#!/bin/sh\necho run\n", "conf": "a=1\n", "sub": {"x": "x\n"},
                    "café.txt": "crème\n"}}


def modes_under(top: Path) -> dict[str, int]:
    """Relative path → permission bits of everything under ``top`` (links not followed), and of
    ``top`` itself as ``"."``."""
    found = {".": stat.S_IMODE(os.lstat(top).st_mode)}
    for dirpath, dirnames, filenames in os.walk(top):
        for name in dirnames + filenames:
            full = os.path.join(dirpath, name)
            st_ = os.lstat(full)
            if not stat.S_ISLNK(st_.st_mode):
                found[os.path.relpath(full, top)] = stat.S_IMODE(st_.st_mode)
    return found


def expected_modes(root: Path) -> dict[str, int]:
    """What fleetctl's layout (docs/layout.md) says each path's mode is, for a root whose
    releases each hold FILES' paths (and one agent ``w1``)."""
    tree = {"runner": 0o755, "runner/run.sh": 0o755, "runner/conf": 0o644, "runner/sub": 0o755,
            "runner/sub/x": 0o644, "runner/café.txt": 0o644, "agents": 0o755, "agents/w1": 0o755,
            "agents/w1/agent.yaml": 0o644}
    want = {".": 0o755, "releases": 0o755, ".fleetctl": 0o755, ".fleetctl/releases": 0o755,
            ".fleetctl/history.jsonl": 0o644, ".fleetctl/identity.json": 0o644}
    for release in os.listdir(root / "releases"):
        want[f"releases/{release}"] = 0o755
        want[f".fleetctl/releases/{release}.json"] = 0o644
        want.update({f"releases/{release}/{k}": v for k, v in tree.items()})
    return want


#: The interpreter the ``python-elsewhere`` login reaches only through ``python:``.
SYSTEM_PYTHON = os.path.realpath("/usr/bin/python3")


@dataclass(frozen=True)
class LoginEnv:
    """One named host environment.

    Attributes:
        name: the variant's id (pytest shows it).
        rc: shell lines put in the login's ``~/.bashrc`` and ``~/.profile``; ``$FLEET_ENV`` in
            them is the variant's own directory (0755, the login's).
        sshd_umask: the umask sshd runs with (its sessions inherit it), or ``None``.
        python_elsewhere: ``python3`` is not on the login's PATH; the inventory's ``python:``
            names an interpreter in ``$FLEET_ENV/bin`` (unless ``inventory`` says otherwise).
        noexec_tmp: a small tmpfs mounted ``noexec,nosuid,nodev`` at ``$FLEET_ENV/tmp``, the
            login's TMPDIR.
        locale: a locale generated with localedef (``de_DE.ISO-8859-1``) that the login's
            LANG and LC_ALL name, found through LOCPATH.
        inventory: keys added to the host's inventory entry.
        sudoers: lines for a drop-in file in /etc/sudoers.d (random name, removed after the
            test; ``{login}`` and ``{python}`` in them are the login and the interpreter the
            inventory names, ``/usr/bin/python3`` unless ``python_elsewhere``).
        setup: called with the :class:`EnvHost` once the user and box exist (as root).
    """

    name: str
    rc: str = ""
    sshd_umask: int | None = None
    python_elsewhere: bool = False
    noexec_tmp: bool = False
    locale: str | None = None
    inventory: dict[str, Any] = field(default_factory=dict)
    sudoers: tuple[str, ...] = ()
    setup: Callable[[EnvHost], None] | None = None

    def __str__(self) -> str:
        return self.name


NOISE_RC = (
    "echo 'Welcome to this box (stdout, from .bashrc)'\n"
    "echo 'a warning from .bashrc on stderr' >&2\n"
    # An event line with no nonce: the client must not take it for the program's hello.
    "echo '{\"t\":\"hello\",\"user\":\"forged\",\"group\":\"forged\",\"uid\":0}'\n"
    "printf 'no newline at the end'\n"
)

#: The NOPASSWD line for ``PYTHON -c BOOTSTRAP`` (tests.helpers.sudoers_args escapes it).
SUDO_ENTRY = "{login} ALL=(root) NOPASSWD: {python} {args}"


def sudo_on_path(host: EnvHost) -> None:
    """sudo on a login PATH that holds only ``$FLEET_ENV/bin`` (python_elsewhere)."""
    os.symlink("/usr/bin/sudo", host.env_dir / "bin" / "sudo")


def write_french_sudo(bin_dir: Path) -> None:
    """A ``sudo`` in ``bin_dir`` (first on a login's PATH) that runs the real one with French
    messages: other wording than any English a parser could know, even under LC_ALL=C (a
    LANGUAGE under C.UTF-8 is honoured by gettext)."""
    wrapper = bin_dir / "sudo"
    wrapper.write_text("#!/bin/sh\nLC_ALL=C.UTF-8 LANGUAGE=fr exec /usr/bin/sudo \"$@\"\n")
    wrapper.chmod(0o755)


def french_sudo(host: EnvHost) -> None:
    """The French ``sudo`` (:func:`write_french_sudo`) in the variant's bin directory."""
    write_french_sudo(host.env_dir / "bin")


MATRIX: list[LoginEnv] = [
    LoginEnv("plain"),
    LoginEnv("umask-077", rc="umask 077\n"),
    LoginEnv("umask-027", rc="umask 027\n"),
    LoginEnv("umask-002", rc="umask 002\n"),
    LoginEnv("sshd-umask-077", sshd_umask=0o077),
    LoginEnv("noisy-rc", rc=NOISE_RC),
    LoginEnv("locale-de-missing", rc="export LANG=de_DE.UTF-8 LC_ALL=de_DE.UTF-8\n"),
    LoginEnv("locale-latin1", locale="de_DE.ISO-8859-1"),
    LoginEnv("python-elsewhere", python_elsewhere=True),
    LoginEnv("noexec-tmp", noexec_tmp=True),
    # become: sudo through the exact entry the docs give (tests/transport/test_sudo_probe.py
    # has the refusals): as it is, with the interpreter outside sudo's secure_path, and with a
    # sudo that speaks French in a German/French login environment.
    LoginEnv("sudo", inventory={"become": "sudo"}, sudoers=(SUDO_ENTRY,)),
    LoginEnv("sudo-python-elsewhere", python_elsewhere=True, inventory={"become": "sudo"},
             sudoers=(SUDO_ENTRY,), setup=sudo_on_path),
    LoginEnv("sudo-french", rc="export LANGUAGE=fr PATH=$FLEET_ENV/bin:$PATH\n",
             inventory={"become": "sudo"}, sudoers=(SUDO_ENTRY,), setup=french_sudo),
]


def variant(name: str) -> LoginEnv:
    """The variant of :data:`MATRIX` called ``name``."""
    return next(env for env in MATRIX if env.name == name)


@dataclass
class EnvHost:
    """One running host of the matrix.

    Attributes:
        env: its variant; box: its sshd; user: the login's ``pwd`` entry; home: its HOME;
        root: the managed root (``<HOME>/fleet/box``, not there before the first ship);
        env_dir: the variant's own directory (``$FLEET_ENV``); key, known_hosts: to log in.
    """

    env: LoginEnv
    box: SshdBox
    user: pwd.struct_passwd
    home: Path
    root: Path
    env_dir: Path
    key: ClientKey
    known_hosts: Path
    python: str | None = None

    def inventory(self, **extra: Any) -> dict[str, Any]:
        """This host's inventory entry (one agent ``w1``, role ``worker``), plus ``extra``."""
        entry = ssh_host(self.box, self.key, self.known_hosts, self.root, user=self.user.pw_name)
        if self.python is not None:
            entry["python"] = self.python
        entry.update(self.env.inventory)
        entry.update(extra)
        return entry

    def run(self, command: str) -> subprocess.CompletedProcess:
        """Run ``command`` on the box as the login, through ssh(1) and its shell (so the rc
        files apply), as an independent look at the environment."""
        return subprocess.run(
            ["ssh", "-p", str(self.box.port), "-i", str(self.key.private_key),
             "-o", f"UserKnownHostsFile={self.known_hosts}", "-o", "StrictHostKeyChecking=yes",
             "-o", "BatchMode=yes", "-F", "/dev/null", f"{self.user.pw_name}@127.0.0.1",
             command], capture_output=True, check=False, stdin=subprocess.DEVNULL, timeout=60)


_locales: dict[str, Path] = {}


def generated_locale(name: str) -> Path:
    """A LOCPATH directory (0755) holding the locale ``name`` (``ll_CC.CHARSET``), generated
    once per process with localedef (~2 s) and removed at exit."""
    if name not in _locales:
        if shutil.which("localedef") is None:
            pytest.skip("localedef is not installed")
        base = Path(tempfile.mkdtemp(prefix="fleet-locale-"))
        base.chmod(0o755)
        atexit.register(shutil.rmtree, base, True)
        source, _, charset = name.partition(".")
        subprocess.run(["localedef", "-i", source, "-f", charset, str(base / name)],
                       check=True, capture_output=True)
        _locales[name] = base
    return _locales[name]


def _make_login(name: str, home: Path) -> pwd.struct_passwd:
    subprocess.run(["useradd", "-m", "-d", str(home), "-s", "/bin/bash", name], check=True,
                   capture_output=True)
    subprocess.run(["usermod", "-p", "*", name], check=True, capture_output=True)
    return pwd.getpwnam(name)


def _remove_login(name: str) -> None:
    wait_until(lambda: subprocess.run(["userdel", "-r", name], capture_output=True)
               .returncode in (0, 6), poll_s=0.1, what=f"userdel -r {name}")


def _chown_tree(path: Path, user: pwd.struct_passwd) -> None:
    for dirpath, dirnames, filenames in os.walk(path):
        for name in [dirpath, *(os.path.join(dirpath, n) for n in dirnames + filenames)]:
            os.lchown(name, user.pw_uid, user.pw_gid)


@pytest.fixture
def env_hosts(sshd_factory, ssh_client_key, tmp_path) -> Iterator[Callable[[LoginEnv], EnvHost]]:
    """``make(env) -> EnvHost``: a box and a login for the variant, gone after the test."""
    made: list[tuple[str, Path | None]] = []
    drop_ins: list[Path] = []

    def make(env: LoginEnv) -> EnvHost:
        if os.geteuid() != 0:
            pytest.skip("the environment matrix needs root (users, sshd, mounts)")
        name = "fle" + secrets.token_hex(4)
        home = Path("/home") / name
        user = _make_login(name, home)
        made.append((name, None))
        env_dir = home / ".fleet-env"
        (env_dir / "bin").mkdir(parents=True)
        rc = [f"export FLEET_ENV={env_dir}"]
        python = None
        if env.python_elsewhere:
            os.symlink(SYSTEM_PYTHON, env_dir / "bin" / "py3")
            rc.append(f"export PATH={env_dir / 'bin'}")
            python = str(env_dir / "bin" / "py3")
        if env.noexec_tmp:
            (env_dir / "tmp").mkdir()
            subprocess.run(["mount", "-t", "tmpfs", "-o", "noexec,nosuid,nodev,size=8m,mode=1777",
                            "tmpfs", str(env_dir / "tmp")], check=True, capture_output=True)
            made.append((name, env_dir / "tmp"))
            rc.append(f"export TMPDIR={env_dir / 'tmp'}")
        if env.locale is not None:
            rc.append(f"export LOCPATH={generated_locale(env.locale)}")
            rc.append(f"export LANG={env.locale} LC_ALL={env.locale}")
        text = "\n".join(rc) + "\n" + env.rc
        for rc_file in (".bashrc", ".profile"):
            (home / rc_file).write_text(text)
        _chown_tree(home, user)
        box = sshd_factory(f"env-{env.name}", authorized={name: ssh_client_key},
                           umask=env.sshd_umask)
        known = write_known_hosts(tmp_path / f"known_hosts-{env.name}", [box])
        host = EnvHost(env, box, user, home, home / "fleet" / "box", env_dir, ssh_client_key,
                       known, python)
        if env.sudoers:
            sudoers = Path("/etc/sudoers.d") / f"fleetctl-env-{secrets.token_hex(6)}"
            drop_ins.append(sudoers)
            wanted = python or "/usr/bin/python3"
            sudoers.write_text("".join(
                line.format(login=name, python=wanted, args=sudoers_args()) + "\n"
                for line in env.sudoers))
            sudoers.chmod(0o440)
            check = subprocess.run(["visudo", "-cf", str(sudoers)], capture_output=True,
                                   text=True)
            assert check.returncode == 0, check.stdout + check.stderr
        if env.setup is not None:
            env.setup(host)
        return host

    try:
        yield make
    finally:
        for path in drop_ins:
            path.unlink(missing_ok=True)
        for name, mount in reversed(made):
            if mount is not None:
                subprocess.run(["umount", "-l", str(mount)], capture_output=True)
            else:
                _remove_login(name)

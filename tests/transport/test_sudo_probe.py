"""sudo, in any language (issue 19): when ``sudo -n -- PYTHON -c BOOTSTRAP`` does not start the
host program, the error says what sudo wanted and the exact fix, found from sudo's behaviour and
never from its words; a sudo or host program that hangs ends at the timeout saying what was
awaited.

Cases from public reports: Ansible's "Timeout waiting for privilege escalation prompt" and its
localised sudo/su prompts (ansible#8681, #17867, #37757: the message matched in English only),
"sorry, you must have a tty to run sudo" with pipelining (ansible#12103, #31131: the fix is
``Defaults:LOGIN !requiretty``), sudo's ``secure_path`` hiding an interpreter installed in
/opt or /usr/local (ansible#73720, #205), and tools that read ``sudo -n true``'s English
(jHardware#1: "sudo: Ein Passwort ist notwendig"; sudo-prompt#9: "sudo: 需要密码").

Everything real: a fresh non-root login on a real sshd box, Debian's sudo reading a drop-in file
with a random name in /etc/sudoers.d, the login's environment set by its own login shell (as
/etc/profile or PAM would: ``LANG=de_DE.UTF-8 LANGUAGE=fr`` and a PATH), and for "another
wording" a ``sudo`` earlier on that PATH that runs the real one in French. Each expected fix is
applied afterwards and the ship then goes through, so the fix is proven, not only printed.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from fleetctl.transport.ssh import last_words, marked
from fleetctl.transport.sudoprobe import SudoProbes, decide
from tests.helpers import cli, make_project, ssh_host, sudoers_args, write_inventory
from tests.hostenv import write_french_sudo
from tests.sshd_boxes import write_known_hosts

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0 or not os.path.exists("/usr/bin/sudo") or not shutil.which("visudo"),
    reason="needs root and sudo (scripts/setup.sh --test installs it)")

# The line a noisy login's start-up prints on stderr before every command.
NOISE = "motd: /home is 91% full"


def entry(login: str, python: str = "/usr/bin/python3") -> str:
    """The exact NOPASSWD line for ``python -c BOOTSTRAP`` (built by the test's own escaping)."""
    return f"{login} ALL=(root) NOPASSWD: {python} {sudoers_args()}"


@dataclass
class BecomeHost:
    """One ``become: sudo`` host reached as a fresh login: its inventory, blueprint, managed
    root, login name, the login's own bin directory (first on its PATH) and its sshd box."""

    inv: Path
    bp: Path
    root: Path
    login: str
    bin: Path
    port: int
    pids: Path
    log: Path

    def logins(self) -> list[str]:
        """sshd's "Accepted ..." lines so far (who logged in, with which key)."""
        return [ln for ln in self.log.read_text().splitlines() if "Accepted " in ln]

    def run(self, *args: str) -> dict:
        """``fleetctl ARGS --format json``: exit 2 asserted, this host's record returned."""
        done = cli(*args, "--format", "json", inventory=self.inv, blueprint=self.bp)
        assert done.code == 2, done.stdout + done.stderr
        host = done.host("web1")
        assert host["status"] == "error", host
        assert "Traceback" not in done.stdout + done.stderr
        return host

    def ships(self) -> None:
        done = cli("ship", "--yes", "--format", "json", inventory=self.inv, blueprint=self.bp)
        assert done.code == 0, done.stdout + done.stderr
        assert (self.root / "current" / "runner" / "run.sh").read_text() == "run\n"


@pytest.fixture
def become_host(tmp_path, login_user, sshd_factory, ssh_client_key):
    """``make(env='', path_prefix=True, python=None, noise=False)`` builds a :class:`BecomeHost`:
    the login's shell exports ``env`` (shell words) and puts the login's bin directory before
    its PATH (or, with ``path_prefix=False``, makes it the whole PATH); with ``noise`` it first
    prints a line on stdout and one on stderr, as a chatty start-up file does. Processes a test's wrapper records in
    ``pids`` are ended by id at teardown."""
    login = login_user.pw_name
    top = Path(tempfile.mkdtemp(prefix="fleetctl-sudo-"))
    os.chmod(top, 0o755)
    bin_dir = top / "bin"
    bin_dir.mkdir(mode=0o755)
    pids = top / "pids"
    pids.mkdir(mode=0o777)
    os.chmod(pids, 0o777)
    box = sshd_factory("sudobox", authorized={login: ssh_client_key})
    known = write_known_hosts(tmp_path / "known_hosts", [box])
    bp = make_project(tmp_path, {"runner": {"run.sh": "run\n"}})
    root = top / "box"

    def make(env: str = "", path_prefix: bool = True, python: str | None = None,
             noise: bool = False) -> BecomeHost:
        shell = top / "login-shell"
        path = f"{bin_dir}:$PATH" if path_prefix else str(bin_dir)
        says = (f"echo 'Welcome to web1: last login yesterday'\necho '{NOISE}' >&2\n" if noise
                else "")
        shell.write_text("#!/bin/sh\n# the login's environment, as /etc/profile or PAM set it\n"
                         f"{says}export {env} PATH={path}\nexec /bin/sh \"$@\"\n")
        shell.chmod(0o755)
        subprocess.run(["usermod", "-s", str(shell), login], check=True, capture_output=True)
        extra = {"python": python} if python else {}
        host = ssh_host(box, ssh_client_key, known, root, user=login, become="sudo", **extra)
        inv = write_inventory(tmp_path / "inv.yaml", {"web1": host})
        return BecomeHost(inv, bp, root, login, bin_dir, box.port, pids, box.log_path)

    try:
        yield make
    finally:
        for pidfile in pids.iterdir():
            try:
                os.kill(int(pidfile.read_text()), signal.SIGKILL)
            except (ProcessLookupError, ValueError):
                pass
        shutil.rmtree(top, ignore_errors=True)


def as_login(login: str, *argv: str) -> subprocess.CompletedProcess:
    """Run ``argv`` as ``login`` through its login shell's environment (``su -s``-free: the
    shell is the login's own), stdin empty."""
    return subprocess.run(["su", login, "-c", " ".join(argv)], capture_output=True, text=True,
                          stdin=subprocess.DEVNULL)


def nothing_written(host: BecomeHost) -> None:
    assert not host.root.exists()


def refusal(host: dict, h: BecomeHost, wanted: str) -> tuple[str, str]:
    """Assert the error names the host, the login@address:port and what sudo wanted; return
    (error, hint)."""
    error, hint = host["error"], host["hint"]
    assert error.startswith(f"web1: become: sudo: `sudo -n` on {h.login}@127.0.0.1:{h.port} "
                            "refused to run fleetctl's host-side program as root; "
                            f"{wanted}"), error
    assert "nothing was written or retried" in error
    # What the login's start-up printed is not sudo's: never quoted as its last words.
    assert NOISE not in error, error
    return error, hint


LOCALES = {
    "english": "",
    # The login's locale is German, its LANGUAGE French; the sudo it runs speaks French.
    "foreign": "LANG=de_DE.UTF-8 LANGUAGE=fr",
    # English, but the login's start-up prints before every command (the probes' too).
    "noisy": "",
}


@pytest.fixture(params=sorted(LOCALES))
def locale(request):
    return request.param


def host_in(become_host, locale: str, **kw) -> BecomeHost:
    h = become_host(env=LOCALES[locale], noise=locale == "noisy", **kw)
    if locale == "foreign":
        write_french_sudo(h.bin)
        said = as_login(h.login, "env", "LC_ALL=C", "sudo", "-n", "true")
        assert said.returncode == 1 and "mot de passe" in said.stderr, said  # not English
    return h


def test_sudo_that_wants_a_password(become_host, sudoers, locale):
    """The exact command, but without NOPASSWD: sudo wants a password; the fix is the NOPASSWD
    line, and with it the ship goes through. In French too (the English parser missed it)."""
    h = host_in(become_host, locale)
    sudoers(f"{h.login} ALL=(root) /usr/bin/python3 {sudoers_args()}")
    for args in (("ship", "--yes"), ("drift",)):
        error, hint = refusal(h.run(*args), h, "sudo wants a password: ")
        assert f"{h.login} has no sudoers rule that sudo applies without one" in error
        assert hint.startswith("fix: add this line to /etc/sudoers.d/fleetctl on the host")
        assert hint.endswith(entry(h.login)), hint
    if locale == "foreign":
        assert "mot de passe" in error  # sudo's own last words are quoted, not read
    nothing_written(h)
    # Stopped, not retried: one login per command, the login's own, never root or another key
    # (the probes ran on that one connection).
    accepted = h.logins()
    assert len(accepted) == 2 and all(f"for {h.login} from" in ln for ln in accepted), accepted
    sudoers(entry(h.login))
    h.ships()


def test_a_password_wanted_for_this_command_only(become_host, sudoers, locale):
    """NOPASSWD for another program and the exact command with a password: sudo lists without
    one and allows the command, but would not run it without a password."""
    h = host_in(become_host, locale)
    sudoers(f"{h.login} ALL=(root) NOPASSWD: /usr/bin/id",
            f"{h.login} ALL=(root) /usr/bin/python3 {sudoers_args()}")
    error, hint = refusal(h.run("drift"), h, "sudo wants a password for this command")
    assert "has no NOPASSWD:" in error and hint.endswith(entry(h.login))
    nothing_written(h)
    sudoers(f"{h.login} ALL=(root) NOPASSWD: /usr/bin/id", entry(h.login))
    h.ships()


def test_requiretty(become_host, sudoers, locale):
    """The right entry but ``Defaults:LOGIN requiretty``: sudo wants a terminal (it accepts the
    login on one, as the pty probe shows); the fix is ``Defaults:LOGIN !requiretty``."""
    h = host_in(become_host, locale)
    sudoers(entry(h.login), f"Defaults:{h.login} requiretty")
    error, hint = refusal(h.run("ship", "--yes"), h, "sudo wants a terminal (Defaults requiretty)")
    assert hint.endswith(f": Defaults:{h.login} !requiretty"), hint
    nothing_written(h)
    sudoers(entry(h.login), f"Defaults:{h.login} requiretty", f"Defaults:{h.login} !requiretty")
    h.ships()


@pytest.mark.parametrize("other", [
    "NOPASSWD: /usr/bin/id",
    # an entry for the interpreter with other arguments (an older fleetctl's command)
    "NOPASSWD: /usr/bin/python3 -c import sys",
    # the right arguments for another interpreter path
    f"NOPASSWD: /usr/local/bin/python3 {sudoers_args()}",
])
def test_a_sudoers_entry_that_does_not_match(become_host, sudoers, locale, other):
    h = host_in(become_host, locale)
    sudoers(f"{h.login} ALL=(root) {other}")
    error, hint = refusal(h.run("ship", "--yes"), h,
                          "sudo wants a sudoers entry for this exact command")
    assert hint.endswith(entry(h.login)), hint
    nothing_written(h)
    sudoers(f"{h.login} ALL=(root) {other}", entry(h.login))
    h.ships()


def test_python3_not_where_the_inventory_says_but_on_the_logins_path(become_host, sudoers,
                                                                      locale):
    """The interpreter the inventory names is not on the host; the login's PATH has a python3
    in /opt-style directory sudo's secure_path does not search: the fix names that absolute
    path for ``python:`` and the sudoers line for it; applying both ships."""
    h = host_in(become_host, locale)
    missing = str(h.bin.parent / "old" / "python3")
    h = host_in(become_host, locale, python=missing)
    found = h.bin / "python3"
    found.symlink_to("/usr/bin/python3")
    sudoers(entry(h.login, missing))
    error, hint = refusal(h.run("ship", "--yes"), h, f"sudo was to run {missing}, and there is no Python")
    assert f"{h.login}'s PATH has one at {found}" in error and "secure_path" in error
    assert hint.startswith(f"fix: set python: {found} for this host in the inventory"), hint
    assert hint.endswith(entry(h.login, str(found))), hint
    nothing_written(h)
    h = host_in(become_host, locale, python=str(found))
    sudoers(entry(h.login, str(found)))
    h.ships()


@pytest.mark.parametrize("noise", [False, True])
def test_sudo_not_on_the_logins_path(become_host, sudoers, noise):
    """sudo is not on the login's PATH (not installed, as far as the login can tell): the error
    says so with the PATH, and the fix installs it and adds the line."""
    h = become_host(path_prefix=False, noise=noise)
    sudoers(entry(h.login))
    assert as_login(h.login, "command", "-v", "sudo").returncode != 0
    error, hint = refusal(h.run("ship", "--yes"), h, f"sudo is not installed for {h.login}")
    assert f"(PATH={h.bin})" in error
    assert hint.startswith("fix: install sudo on the host") and hint.endswith(entry(h.login))
    nothing_written(h)


@pytest.mark.parametrize("timeout_s", [3])
def test_a_slow_sudo_ends_at_the_timeout_saying_what_was_awaited(become_host, sudoers,
                                                                 timeout_s):
    """A sudo that never starts the program (a PAM or LDAP lookup that hangs, here a wrapper
    first on the login's PATH that sleeps): ship and drift end at ``--timeout`` with a message
    that says sudo did not start the host program, and after how many seconds."""
    h = become_host()
    sudoers(entry(h.login))
    slow = h.bin / "sudo"
    slow.write_text(f"#!/bin/sh\necho $$ > {h.pids}/sudo-$$\nexec sleep 600\n")
    slow.chmod(0o755)
    for args in (("ship", "--yes"), ("drift",)):
        started = time.monotonic()
        done = cli(*args, "--format", "json", "--timeout", str(timeout_s), inventory=h.inv,
                   blueprint=h.bp)
        elapsed = time.monotonic() - started
        assert done.code == 2, done.stdout + done.stderr
        error = done.host("web1")["error"]
        assert error.startswith(f"web1: timed out after {timeout_s} s: sudo did not start the "
                                "host program"), error
        assert elapsed < 4 * timeout_s + 10, elapsed  # the timeout, not the 600 s sleep
    nothing_written(h)


def test_a_host_program_that_stops_answering_ends_at_the_timeout(become_host, sudoers):
    """The host program starts (its hello arrives) and then hangs (an interpreter whose stdout
    takes its first line and then never returns, as a process stuck on a dead NFS mount): the error says
    the host program did not answer, names its last report and the seconds waited."""
    h = become_host()
    stuck = h.bin.parent / "stuck"
    stuck.mkdir(mode=0o755)
    (stuck / "sitecustomize.py").write_text(
        "import io, os, sys, time\n"
        "class Stuck(io.RawIOBase):\n"
        "    def writable(self):\n"
        "        return True\n"
        "    def write(self, data):\n"
        "        data = bytes(data)\n"
        "        first = len(data) - len(data.lstrip(b'\\n'))\n"
        "        os.write(1, data[:data.find(b'\\n', first) + 1])\n"
        "        time.sleep(600)\n"
        "sys.stdout = io.TextIOWrapper(io.BufferedWriter(Stuck()))\n")
    python = h.bin / "python-stuck"
    python.write_text(f"#!/bin/sh\necho $$ > {h.pids}/py-$$\n"
                      f"PYTHONPATH={stuck} exec /usr/bin/python3 \"$@\"\n")
    python.chmod(0o755)
    h = become_host(python=str(python))
    sudoers(entry(h.login, str(python)))
    done = cli("drift", "--format", "json", "--timeout", "8", inventory=h.inv, blueprint=h.bp)
    assert done.code == 2, done.stdout + done.stderr
    error = done.host("web1")["error"]
    assert error.startswith("web1: timed out after 8 s: the host program did not answer (its "
                            "last report was 'hello')"), error


def test_an_interpreter_that_breaks_as_it_starts_is_not_blamed_on_sudo(become_host, sudoers):
    """sudo starts the interpreter, which fails before the host program says a word (a broken
    site-packages, here a wrapper that exits 1): the probes see the login cannot run it either,
    so the error is the program's own failure with its last line, not something sudo wanted.
    (Before the login's own run was probed, this was reported as a password wanted.)"""
    h = become_host()
    python = h.bin / "python-broken"
    python.write_text("#!/bin/sh\necho 'broken interpreter: no encodings module' >&2\nexit 1\n")
    python.chmod(0o755)
    h = become_host(python=str(python))
    sudoers(entry(h.login, str(python)))
    error = h.run("drift")["error"]
    assert "sudo wants" not in error and "sudo was to run" not in error, error
    assert error.startswith(f"web1: the host-side program did not start under '{python}'"), error
    assert "broken interpreter: no encodings module" in error, error


# -- the decision, over every combination of answers -----------------------------------------

ARGV = ["/usr/bin/python3", "-c", "import sys"]
maybe = st.sampled_from([None, True, False])
paths = st.sampled_from([None, "/usr/bin/sudo", "/opt/x/bin/python3"])
probes = st.builds(SudoProbes, answered=st.booleans(), sudo_path=paths, login_path=st.sampled_from([None, "/bin"]),
                   lists=maybe, lists_tty=maybe, allows=maybe, python_ok=maybe,
                   python_found=paths, runs=maybe, said=st.text(max_size=40))


@given(probes, st.text(max_size=40))
def test_sudos_words_never_change_the_verdict(found, other_words):
    """What sudo wrote is quoted, never read: any other text gives the same verdict."""
    again = SudoProbes(**{**{f: getattr(found, f) for f in SudoProbes.__slots__},
                          "said": other_words})
    assert decide(found, "deploy", ARGV) == decide(again, "deploy", ARGV)


@given(probes)
def test_every_verdict_carries_an_exact_fix_and_none_when_sudo_ran_it(found):
    refusal = decide(found, "deploy", ARGV)
    if found.sudo_path and found.runs:
        assert refusal is None
    if refusal is None:
        return
    fixes = ("deploy ALL=(root) NOPASSWD: ", "Defaults:deploy !requiretty", "set python: /",
             "install Python 3.8")
    assert any(fix in refusal.fix for fix in fixes), refusal
    assert found.answered


@pytest.mark.parametrize("silent_from", range(8))
def test_probes_that_do_not_answer_in_time_never_make_a_verdict_up(silent_from):
    """A host whose probes stop answering (a sudo slow only sometimes) from the n-th on: the
    first probe unanswered means no verdict at all (never "sudo is not installed"); later ones
    unanswered never give a verdict that needs their answer."""
    from fleetctl.transport.base import ProbeResult
    from fleetctl.transport.sudoprobe import run_probes

    asked: list[list[str]] = []

    def probe(argv, tty=False, stdin=b""):
        asked.append(argv)
        if len(asked) > silent_from:
            return ProbeResult(None)
        if argv[0] == "/bin/sh":
            return ProbeResult(0, b"motd noise\n/usr/bin/sudo\n")
        return ProbeResult(0, stdin)  # every sudo question answered yes; runs echo the token

    found = run_probes(probe, ARGV)
    verdict = decide(found, "deploy", ARGV)
    if silent_from == 0:
        assert not found.answered and verdict is None
    else:
        assert found.sudo_path == "/usr/bin/sudo"  # the last line, after the noise
        assert verdict is None, verdict


# One line of text: no character str.splitlines() would break at.
_line = st.text(st.characters(blacklist_categories=("Cs",),
                              blacklist_characters="\n\r\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029"),
                max_size=30)


@given(noise=st.lists(_line, max_size=5), words=st.lists(_line, max_size=5))
def test_what_the_login_printed_before_the_mark_is_never_the_commands_words(noise, words):
    """Whatever a start-up file printed before the probe's mark (the mark itself included),
    the words quoted are the command's own last non-blank line after it, or none."""
    mark, _ = marked(["true"])
    stderr = "\n".join([*noise, mark, *noise, mark, *words]) + "\n"
    own = [w.strip() for w in words if w.strip()]
    assert last_words(stderr, mark) == (own[-1] if own else "")
    assert last_words("\n".join(noise), mark) == ""

"""Why sudo did not start the host program, found from sudo's behaviour, never from its words.

sudo's messages are translated (``sudo: Ein Passwort ist notwendig``), differ between versions and
implementations (sudo 1.9, sudo-rs) and say "a password is required" even for a command no rule
allows. So when ``sudo -n -- PYTHON -c BOOTSTRAP`` ends before the host program said ``hello``,
fleetctl asks sudo questions whose answer is an exit status (sudoers(5), sudo(8)):

============================================ ====================================================
probe (each run as the login, ``LC_ALL=C``)  what its exit status says
============================================ ====================================================
``sh -c 'command -v sudo'``                  sudo is on the login's PATH at all
``sudo -n -l``                               the login has a rule sudo applies without a password
                                             (sudo's default ``listpw=any``: one NOPASSWD rule is
                                             enough); run again on a pseudo-terminal when it fails:
                                             passing only there means ``requiretty``
``sudo -n -l -- PYTHON -c BOOTSTRAP``        some rule allows this exact command (0), or none (1)
``PYTHON -c BOOTSTRAP`` with a program that  the interpreter exists, is Python 3.8+ and runs the
only prints a token (if Python 3.8+)         command (as the login, no sudo): the program prints a
                                             token only a real run can print; when it does not,
                                             ``command -v`` of its name on the login's PATH says
                                             where an interpreter is
``sudo -n -- PYTHON -c BOOTSTRAP`` with the  sudo runs the command without a password (the token
same program                                 comes back)
============================================ ====================================================

:func:`run_probes` asks them (effects, through a callable) into :class:`SudoProbes`;
:func:`decide` turns those into what sudo wanted and the exact fix (pure). sudo's own last line is
quoted in the error for the person, never read by fleetctl. Nothing is retried with other
credentials and nothing else is run as root (invariant 8): the last probe runs the very command
fleetctl was going to run, with a program that does nothing but print.
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass

from fleetctl.errors import PermissionDenied
from fleetctl.transport.base import ProbeResult
from fleetctl.transport.become import sudoers_entry

#: Where the docs tell operators to put the entry (a name in /etc/sudoers.d must have no ``.``).
SUDOERS_FILE = "/etc/sudoers.d/fleetctl"


#: ``probe(argv, tty=False, stdin=b"") -> ProbeResult``: runs argv as the login, on the host.
Prober = Callable[..., ProbeResult]


@dataclass(frozen=True, slots=True)
class SudoProbes:
    """What the probes found (``None``: not asked, or no answer).

    Attributes:
        answered: the first probe answered in time (when it did not, nothing is known).
        sudo_path: where ``command -v sudo`` found sudo on the login's PATH; ``None``: nowhere.
        login_path: the login's PATH (asked only when sudo was not found).
        lists: ``sudo -n -l`` succeeded without a terminal.
        lists_tty: the same on a pseudo-terminal (asked only when ``lists`` failed).
        allows: ``sudo -n -l -- PYTHON -c BOOTSTRAP`` succeeded (on a terminal if only
            ``lists_tty`` did).
        python_ok: ``PYTHON`` is Python 3.8 or later and runs the command as the login.
        python_found: an interpreter of the same name on the login's PATH that is (absolute).
        runs: sudo ran the exact command without a password (the empty program's token came
            back).
        said: the last line sudo wrote to stderr in the first probe that failed (for people).
    """

    answered: bool = True
    sudo_path: str | None = None
    login_path: str | None = None
    lists: bool | None = None
    lists_tty: bool | None = None
    allows: bool | None = None
    python_ok: bool | None = None
    python_found: str | None = None
    runs: bool | None = None
    said: str = ""


@dataclass(frozen=True, slots=True)
class SudoRefusal:
    """What sudo wanted (or what was missing), in words for the operator, and the exact fix."""

    wanted: str
    fix: str


def _ok(result: ProbeResult) -> bool | None:
    return None if result.status is None else result.status == 0


def _last_line(result: ProbeResult) -> str:
    """The last line of a probe's stdout: what the command printed, after anything the login's
    shell start-up files printed before it (noise)."""
    return result.stdout.decode("utf-8", "replace").rstrip("\n").rpartition("\n")[2]


def _printed(result: ProbeResult, token: str) -> bool | None:
    """Whether the run printed ``token`` (only a real run of the program can); ``None`` when it
    did not end in time."""
    return None if result.status is None else token.encode() in result.stdout


def _path_of(result: ProbeResult) -> str | None:
    """The absolute path ``command -v`` printed (exit 0), else ``None``."""
    line = _last_line(result)
    return line if result.status == 0 and line.startswith("/") else None


def _command_v(name: str) -> list[str]:
    return ["/bin/sh", "-c", 'command -v -- "$1"', "sh", name]


def run_probes(probe: Prober, argv: list[str]) -> SudoProbes:
    """Ask sudo and the host the questions of the module's table, stopping when one settles it.

    Args:
        probe: runs one command as the login on the host (see :data:`Prober`).
        argv: the command fleetctl gave sudo: ``[PYTHON, "-c", BOOTSTRAP]``.

    Returns:
        The answers; a probe that did not answer in time leaves ``None``.
    """
    said = ""

    def note(result: ProbeResult) -> ProbeResult:
        nonlocal said
        if result.status != 0 and not said:
            said = result.said
        return result

    sudo = ["env", "LC_ALL=C", "sudo", "-n"]
    looked = probe(_command_v("sudo"))
    if looked.status is None:  # no answer in time: nothing can be said
        return SudoProbes(answered=False)
    sudo_path = _path_of(looked)
    if sudo_path is None:
        where = probe(["/bin/sh", "-c", 'printf "%s\\n" "$PATH"'])
        return SudoProbes(login_path=_last_line(where) if where.status == 0 else None)
    lists = _ok(note(probe([*sudo, "-l"])))
    lists_tty = None if lists else _ok(probe([*sudo, "-l"], tty=True))
    allows = _ok(note(probe([*sudo, "-l", "--", *argv], tty=not lists and bool(lists_tty))))
    token = "fleetctl-probe-" + secrets.token_hex(8)
    program = (f"import sys;sys.stdout.write({token!r} if sys.version_info >= (3, 8) else '')"
               .encode())
    empty_run = b"%d\n%s" % (len(program), program)
    # The login itself runs the very command, without sudo.
    python_ok = _printed(probe(argv, stdin=empty_run), token)
    python_found = None
    if not python_ok:
        found = _path_of(probe(_command_v(argv[0].rsplit("/", 1)[-1])))
        if found and found != argv[0] and _printed(probe([found, *argv[1:]], stdin=empty_run),
                                                   token):
            python_found = found
    runs = None
    if lists and allows and python_ok:
        runs = _printed(note(probe([*sudo, "--", *argv], stdin=empty_run)), token)
    return SudoProbes(sudo_path=sudo_path, lists=lists, lists_tty=lists_tty, allows=allows,
                      python_ok=python_ok, python_found=python_found, runs=runs, said=said)


def decide(found: SudoProbes, login: str, argv: list[str]) -> SudoRefusal | None:
    """What sudo wanted, from the probes; ``None`` when sudo is not what stopped the program.

    Args:
        found: the probes' answers.
        login: the SSH login.
        argv: the command fleetctl gave sudo (``[PYTHON, "-c", BOOTSTRAP]``).

    Returns:
        The first thing in the way, in the order an operator must fix them: sudo missing, the
        interpreter missing, a terminal wanted (requiretty), a password wanted, no entry for
        the command, a password wanted for that command; ``None`` when sudo ran the command.
    """
    entry = sudoers_entry(login, argv)
    add = (f"add this line to {SUDOERS_FILE} on the host (edit with visudo -f {SUDOERS_FILE}, "
           f"mode 0440): {entry}")
    if not found.answered:
        return None
    if found.sudo_path is None:
        path = f" (PATH={found.login_path})" if found.login_path is not None else ""
        return SudoRefusal(
            f"sudo is not installed for {login}: no sudo on its PATH{path}",
            f"install sudo on the host (or put it on {login}'s PATH), then {add}")
    if found.runs:  # sudo ran this very command without a password: not what stopped it
        return None
    if found.python_ok is False and found.allows is False:
        if found.python_found:
            moved = [found.python_found, *argv[1:]]
            return SudoRefusal(
                f"sudo was to run {argv[0]}, and there is no Python 3.8+ there; "
                f"{login}'s PATH has one at {found.python_found}, but sudo looks programs up "
                "in its secure_path, not in the login's PATH",
                f"set python: {found.python_found} for this host in the inventory, and add "
                f"this line to {SUDOERS_FILE} on the host (visudo -f {SUDOERS_FILE}): "
                f"{sudoers_entry(login, moved)}")
        return SudoRefusal(
            f"sudo was to run {argv[0]}, and there is no Python 3.8+ there (none on "
            f"{login}'s PATH either)",
            f"install Python 3.8 or later on the host and set python: to its absolute path "
            f"for this host in the inventory; then {add} (with that path)")
    if found.lists is False and found.lists_tty:
        both = "" if found.allows else f"; and no rule matches this exact command: {add}"
        return SudoRefusal(
            f"sudo wants a terminal (Defaults requiretty): it accepts {login} on one and "
            "fleetctl runs without one",
            f"add this line to {SUDOERS_FILE} on the host (visudo -f {SUDOERS_FILE}): "
            f"Defaults:{login} !requiretty{both}")
    if found.lists is False:
        return SudoRefusal(
            f"sudo wants a password: {login} has no sudoers rule that sudo applies without one "
            "(fleetctl runs sudo -n and never sends a password)", add)
    if found.allows is False:
        return SudoRefusal(
            f"sudo wants a sudoers entry for this exact command: {login}'s rules without a "
            "password "
            "name other commands (sudo matches the program and every argument)", add)
    if found.runs is False:
        return SudoRefusal(
            f"sudo wants a password for this command: the rule that allows it to {login} has no "
            "NOPASSWD: (fleetctl runs sudo -n and never sends a password)", add)
    return None


def _within(probe: Prober, budget_s: float) -> Prober:
    """``probe`` that answers ``None`` (no answer) once ``budget_s`` seconds have passed, so
    the probes together take about one timeout, not one each."""
    deadline = time.monotonic() + budget_s

    def bounded(argv: list[str], tty: bool = False, stdin: bytes = b"") -> ProbeResult:
        if time.monotonic() >= deadline:
            return ProbeResult(None)
        return probe(argv, tty=tty, stdin=stdin)

    return bounded


def sudo_refusal(probe: Prober, label: str, login: str, where: str, argv: list[str],
                 budget_s: float = 30.0) -> PermissionDenied | None:
    """Probe (:func:`run_probes`), decide (:func:`decide`) and word the error.

    Args:
        probe: runs one command as the login on the host.
        label: the host's inventory name.
        login: the login sudo ran for.
        where: ``LOGIN@ADDRESS:PORT`` (or the login alone for a local host).
        argv: the command fleetctl gave sudo.
        budget_s: seconds the probes may take together (no probe starts after that; each
            is bounded by the transport's own timeout).

    Returns:
        The error naming the host, the login, what sudo wanted and the exact fix; ``None``
        when sudo is not what stopped the program.
    """
    found = run_probes(_within(probe, budget_s), argv)
    refusal = decide(found, login, argv)
    if refusal is None:
        return None
    said = f" (sudo's last words: {found.said!r})" if found.said else ""
    return PermissionDenied(
        f"{label}: become: sudo: `sudo -n` on {where} refused to run fleetctl's host-side "
        f"program as root; {refusal.wanted}{said}; stopped, nothing was written "
        "or retried",
        hint=f"fix: {refusal.fix}")

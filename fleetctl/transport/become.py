"""Becoming root on a host through a non-root login (``become: sudo`` in the inventory).

Many fleets forbid root over SSH. With ``become: sudo`` fleetctl logs in as the inventory's
``user`` and starts its host-side program as ``sudo -n -- PYTHON -c BOOTSTRAP``: ``-n`` makes sudo
fail at once instead of asking for a password, so fleetctl never asks for, sends or stores one.
The command is always the same argv (the host-side program and its input travel over stdin), so
one exact sudoers entry allows it and nothing else (:func:`sudoers_entry`). When sudo refuses,
:func:`sudo_refusal` recognises its message and the caller stops that host with an error naming
it and the sudoers entry it needs (DESIGN.md invariant 8: no retry, no other way up).
"""

from __future__ import annotations

SUDO = "sudo"
#: What fleetctl puts before the host-side command: never prompt (``-n``), end of options.
SUDO_PREFIX = (SUDO, "-n", "--")

#: sudo's own messages (Debian's sudo 1.9), each with what it means for the operator.
_REFUSALS = (
    ("a password is required", "sudo would ask for a password"),
    ("is not in the sudoers file", "the login is not in the sudoers file"),
    ("not allowed to execute", "the sudoers file does not allow this command"),
    ("a terminal is required", "sudo requires a terminal (Defaults requiretty)"),
    ("sudo: not found", "sudo is not installed"),
    ("sudo: command not found", "sudo is not installed"),
)

# Characters sudoers treats specially inside a command's arguments (sudoers(5), "Other special
# characters and reserved words"): they must be escaped with a backslash.
_SUDOERS_SPECIAL = ("\\", ",", ":", "=")


def become_argv(argv: list[str], become: str | None) -> list[str]:
    """``argv`` as the host must run it: unchanged, or behind ``sudo -n --`` for ``sudo``."""
    if become == "sudo":
        return [*SUDO_PREFIX, *argv]
    return list(argv)


def sudoers_entry(login: str, argv: list[str]) -> str:
    """The narrowest sudoers line that lets ``login`` run ``argv`` as root without a password.

    Args:
        login: the SSH login (the inventory's ``user``).
        argv: the command fleetctl runs under sudo (absolute program, then its arguments).

    Returns:
        ``LOGIN ALL=(root) NOPASSWD: PROGRAM ARGS`` with sudoers' special characters in the
        arguments escaped; only that exact command line matches it.
    """
    args = " ".join(argv[1:])
    for char in _SUDOERS_SPECIAL:
        args = args.replace(char, "\\" + char)
    return f"{login} ALL=(root) NOPASSWD: {argv[0]} {args}"


def sudo_refusal(stderr: str) -> str | None:
    """What sudo refused, from the tail of the command's stderr; ``None`` if it did not."""
    for needle, meaning in _REFUSALS:
        if needle in stderr:
            return meaning
    return None

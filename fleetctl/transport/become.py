"""Becoming root on a host through a non-root login (``become: sudo`` in the inventory).

Many fleets forbid root over SSH. With ``become: sudo`` fleetctl logs in as the inventory's
``user`` and starts its host-side program as ``sudo -n -- PYTHON -c BOOTSTRAP``: ``-n`` makes sudo
fail at once instead of asking for a password, so fleetctl never asks for, sends or stores one.
The command is always the same argv (the host-side program and its input travel over stdin), so
one exact sudoers entry allows it and nothing else (:func:`sudoers_entry`). When sudo does not
start the program, :mod:`fleetctl.transport.sudoprobe` finds out why from sudo's behaviour (never
its words) and the caller stops that host with an error naming what sudo wanted and the fix
(docs/invariants.md, invariant 8: no retry, no other way up).
"""

from __future__ import annotations

SUDO = "sudo"
#: What fleetctl puts before the host-side command: never prompt (``-n``), end of options.
SUDO_PREFIX = (SUDO, "-n", "--")

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

"""The exception hierarchy fleetctl raises, and the one place that maps it to exit codes.

Exit codes follow diff(1) and click (DESIGN.md §4): 0 nothing to report, 1 findings, 2 trouble
(bad input, unreachable host, incomplete scan), 3 ship refused with nothing written. When hosts
disagree the worst one wins, ranked 2 over 3 over 1 over 0.
"""

from __future__ import annotations

EXIT_OK = 0
EXIT_FINDINGS = 1
EXIT_ERROR = 2
EXIT_REFUSED = 3

# Rank used to pick the worst exit code across hosts: 2 over 3 over 1 over 0.
_SEVERITY = {EXIT_OK: 0, EXIT_FINDINGS: 1, EXIT_REFUSED: 2, EXIT_ERROR: 3}


def worst_exit(codes: list[int] | tuple[int, ...]) -> int:
    """Return the most severe exit code of ``codes`` (2 > 3 > 1 > 0); 0 for an empty list."""
    return max(codes, key=lambda c: _SEVERITY.get(c, 3), default=EXIT_OK)


class FleetctlError(Exception):
    """Root of every error fleetctl reports to a user; carries a message and an optional hint."""

    exit_code = EXIT_ERROR

    def __init__(self, message: str, hint: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint


class InputError(FleetctlError):
    """Bad input: inventory, role, blueprint or template; names the file, key or line."""


class HostError(FleetctlError):
    """A host could not be reached, refused an operation, or failed part-way.

    ``step`` names where a ship stopped (``lock``, ``assemble``, ``verify``...), if it did.
    """

    def __init__(self, message: str, hint: str | None = None, step: str | None = None) -> None:
        super().__init__(message, hint)
        self.step = step


class IncompleteScan(HostError):
    """The scan could not read every path, so nothing can be claimed or shipped over it."""


class HostKeyError(HostError):
    """A host's key is unknown to known_hosts or does not match it (invariant 7)."""


class PermissionDenied(HostError):
    """The host refused an operation; fleetctl stops and names it (invariant 8)."""


class ShipRefused(FleetctlError):
    """Ship would discard hand-patches, the host is locked, or it changed since the plan."""

    exit_code = EXIT_REFUSED

    def __init__(self, message: str, hint: str | None = None, step: str | None = None) -> None:
        super().__init__(message, hint)
        self.step = step

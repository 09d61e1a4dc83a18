"""Scanning a host: one round trip that returns its live and shipped state, and drift from it."""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Iterator
from typing import Any

from fleetctl.blueprint import Blueprint
from fleetctl.credentials import LEFTOVER_PREFIX, is_credential_path
from fleetctl.drift import PENDING, Change, compare
from fleetctl.inventory import Host
from fleetctl.livestate import LiveState, read_scan
from fleetctl.manifest import FILE, Manifest
from fleetctl.render import DesiredTree
from fleetctl.session import HostSession, open_session


@contextlib.contextmanager
def host_session(host: Host, op: str, extra: dict[str, Any] | None = None
                 ) -> Iterator[tuple[HostSession, LiveState]]:
    """Connect, start the host program with ``op`` (``scan`` or ``ship``) and read the scan.

    ``extra`` adds keys to the request (a dry run's read-only look at a host's units). The
    agents' own accounts are always asked about (:func:`accounts_request`).

    Yields ``(session, state)``; the caller may go on reading the session's events. The
    program is ended and the connection closed on exit, whatever happened.

    Raises:
        HostError: unreachable host, bad host key, host-side failure or timeout.
        ShipRefused: ``op`` is ``ship`` and another ship holds the host's lock.
    """
    request = {"op": op, **accounts_request(host), **(extra or {})}
    with open_session(host, request) as session:
        yield session, read_scan(session)


def accounts_request(host: Host) -> dict[str, list[dict[str, str]]]:
    """The request key asking the host about its agents' own accounts.

    ``{"accounts": [{"user", "group", "home"}, ...]}``, one per distinct user; agents without
    a user of their own are not in it. The scan's answer is ``LiveState.accounts``.
    """
    seen: dict[str, dict[str, str]] = {}
    for agent in host.agents:
        if agent.user and agent.user not in seen:
            seen[agent.user] = {"user": agent.user, "group": agent.group or agent.user,
                                "home": agent.home or f"/home/{agent.user}"}
    return {"accounts": list(seen.values())}


def _account_stop(user: str, info: dict[str, Any]) -> str | None:
    """Why the ship's users step would stop on this existing account, or ``None``."""
    if info.get("uid") == 0:
        return (f"user {user} has uid 0 in /etc/passwd: root in all but name (ship stops: give "
                "the agent an unprivileged user)")
    if info.get("passwd_home") and \
            info["passwd_home"].rstrip("/") != str(info.get("home", "")).rstrip("/"):
        return (f"user {user} has HOME {info['passwd_home']} in /etc/passwd, not "
                f"{info.get('home')} as the inventory says (ship stops: fix home:)")
    return None


def account_stops(state: LiveState) -> list[str]:
    """The agents' accounts a ship stops on (the host's users step refuses them): a user with
    uid 0, one whose HOME in /etc/passwd is not the inventory's, or a HOME that is not a
    directory. One line each, as in :func:`account_problems`."""
    stops = []
    for user, info in sorted((state.accounts or {}).items()):
        stop = (_account_stop(user, info) if info.get("exists") else None) or \
            _home_stop(user, info)
        if stop:
            stops.append(stop)
    return stops


def _home_stop(user: str, info: dict[str, Any]) -> str | None:
    """The line for a HOME that exists and is not a directory (a file or a symlink), else
    ``None``."""
    if info.get("home_mode") is not None and not info.get("home_exists"):
        return (f"HOME {info.get('home')} of {user} is not a directory (ship stops until it is "
                "moved aside)")
    return None


def account_problems(host: Host, state: LiveState) -> list[str]:
    """What a ship would create for the agents' accounts (missing users, groups and HOMEs),
    and what it would stop on (:func:`account_stops`).

    One line each, e.g. ``"user fleet-eng does not exist (ship creates it)"``.
    """
    problems = []
    for user, info in sorted((state.accounts or {}).items()):
        stop = _account_stop(user, info) if info.get("exists") else None
        if not info.get("exists"):
            problems.append(f"user {user} does not exist (ship creates it)")
        elif stop:
            problems.append(stop)
            continue
        elif not info.get("group_exists"):
            problems.append(f"group of user {user} does not exist (ship creates it)")
        home_stop = _home_stop(user, info)
        if home_stop:
            problems.append(home_stop)
        elif not info.get("home_exists"):
            problems.append(f"HOME {info.get('home')} of {user} does not exist (ship creates it)")
    return problems


def shipped_base(state: LiveState) -> Manifest | None:
    """The base of the three-way comparison for a scanned host.

    An empty manifest when the host has nothing under its root (nothing there can be lost);
    ``None`` (origin ``unknown``) when it has a tree but no record of shipping it.
    """
    if state.current_kind is None:
        return Manifest()
    return state.shipped


def desired_for(tree: DesiredTree, state: LiveState) -> Manifest:
    """The desired manifest with the host's default owner filled in.

    A credential file of an unchecked grant (its secret was not available, so its content is
    unknown) takes the digest the shipped record has for that path: its live content is then
    compared with what was shipped alone, and a hand-patch is still found. Without a shipped
    file there, it takes the live digest (its content cannot be judged); with neither, it stays
    without a digest (``missing``).
    """
    desired = tree.manifest.with_default_owner(state.owner)
    if not tree.unchecked:
        return desired
    unchecked = {p for u in tree.unchecked for p in u.paths}
    shipped = state.shipped if state.shipped is not None else Manifest()
    entries = []
    for entry in desired:
        if entry.path in unchecked and entry.digest is None:
            for known in (shipped.get(entry.path), state.live.get(entry.path)):
                if known is not None and known.type == FILE and known.digest:
                    entry = dataclasses.replace(entry, digest=known.digest)
                    break
        entries.append(entry)
    return Manifest(entries)


def _own_leftover(change: Change) -> Change:
    """A new credential file an interrupted ship left behind is fleetctl's own, never a
    hand-patch: the next ship removes it without needing --force."""
    name = change.path.rpartition("/")[2]
    if change.change == "extra" and is_credential_path(change.path) and \
            name.startswith(LEFTOVER_PREFIX):
        return dataclasses.replace(change, origin=PENDING)
    return change


def changes_for(blueprint: Blueprint, tree: DesiredTree, state: LiveState) -> list[Change]:
    """Every change between the host's live tree and the desired tree, with origins.

    Nothing is claimed about a path the scan could not read, or anything below it: it would
    show as ``missing`` only because it was not seen.
    """
    changes = [_own_leftover(c) for c in compare(desired_for(tree, state), state.live,
                                                   shipped_base(state), blueprint.ignore)]
    if not state.unreadable:
        return changes
    unseen = [u.path for u in state.unreadable]
    if any(p in ("", ".") for p in unseen):
        return []
    return [c for c in changes
            if not any(c.path == p or c.path.startswith(p + "/") for p in unseen)]

"""The ship plan: what a ship of one host will do, decided as data from its scan alone.

A pure function (:func:`plan_ship`) takes the desired manifest, the host's scan (live and shipped
manifests, identity, layout, accounts), the changes between them, how the source relates to the
host's commit, and the ship's options, and returns a frozen :class:`ShipPlan`: refused or not and
why, nothing to do, which files are copied on the host and which contents are sent, which
credential files are written, which accounts are created, what is overridden, and the plan's
digest. It does no I/O, so it is tested on small case files (``tests/cases/plan/``), and the dry
run and the real ship use the very same plan: a dry run is scan, plan, report.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from fleetctl.credentials import is_credential_path
from fleetctl.drift import REFUSED_ORIGINS, Change
from fleetctl.manifest import FILE, Manifest, sha256_digest
from fleetctl.names import show_name
from fleetctl.source import Ancestry

if TYPE_CHECKING:
    from fleetctl.inventory import Host
    from fleetctl.livestate import LiveState

READY, NO_OP, REFUSED, ERROR, INCOMPLETE = "ready", "no-op", "refused", "error", "incomplete"


@dataclass(frozen=True, slots=True)
class PlanOptions:
    """The ship options a plan depends on (see ``fleetctl ship --help``).

    Attributes:
        force: overwrite every hand-patch and ship over a stale checkout.
        force_paths: overwrite the hand-patches at these paths only (a directory covers what
            is below it).
        renamed_from: the identity the host recorded before a deliberate rename.
        approved: the plan digest the user confirmed for this host, or ``None`` if none was
            asked for.
        confirmed: the changes of that confirmed plan, so a refusal can name what differs.
    """

    force: bool = False
    force_paths: tuple[str, ...] = ()
    renamed_from: str | None = None
    approved: str | None = None
    confirmed: tuple[Change, ...] = ()

    def forces(self, path: str) -> bool:
        """Whether ``path`` may be overwritten although it was changed on the host."""
        return self.force or any(path == p or path.startswith(p.rstrip("/") + "/")
                                 for p in self.force_paths)


@dataclass(frozen=True, slots=True)
class ShipPlan:
    """What a ship of one host will do.

    Attributes:
        host: the inventory name.
        status: ``ready`` (a new release), ``no-op`` (nothing to change), ``refused`` (exit 3),
            ``error`` or ``incomplete`` (exit 2).
        changes: every change, in path order.
        reason, hint, step: for a refusal or an error: why, what to do, which check stopped it.
        copies: ``(path, live path)`` for each file the host copies from its release in use
            (same content found there), in path order.
        sends: digests of the contents to send (each once), in desired-path order.
        secrets: digests of the credential files to write (new content or new path).
        accounts: what the ship would create for the agents' users, groups and HOMEs.
        forced_paths: paths changed on the host that this ship overwrites (by ``--force`` or
            ``--force-path``).
        ancestry: how the source relates to the host's commit.
        digest: identifies the plan (changes, desired tree, release in use), so a confirmed plan
            can be checked again under the lock.
    """

    host: str
    status: str
    changes: tuple[Change, ...] = ()
    reason: str | None = None
    hint: str | None = None
    step: str | None = None
    copies: tuple[tuple[str, str], ...] = ()
    sends: tuple[str, ...] = ()
    secrets: tuple[str, ...] = ()
    accounts: tuple[str, ...] = ()
    forced_paths: tuple[str, ...] = ()
    ancestry: Ancestry | None = None
    digest: str = ""
    identity_problem: bool = field(default=False, repr=False)

    @property
    def needs_confirmation(self) -> bool:
        """Whether the ship would write a new release (what the prompt asks about)."""
        return self.status == READY

    @property
    def forced(self) -> dict[str, Any] | None:
        """What this plan overrides, as recorded in the release (``None``: nothing)."""
        stale = self.ancestry.to_json() if self.ancestry and self.ancestry.stale else None
        if not self.forced_paths and stale is None:
            return None
        return {"paths": list(self.forced_paths), "stale": stale}


def plan_digest(changes: list[Change] | tuple[Change, ...], desired: Manifest,
                current: str | None) -> str:
    """Identify a plan: same changes, same desired tree, same starting release."""
    # Live and desired attributes are part of it: a hand-patch edited again after the plan was
    # confirmed is a different plan, even with the same paths, kinds and origins.
    body = json.dumps([[c.path, c.change, c.origin, c.live and c.live.to_json(),
                        c.desired and c.desired.to_json()] for c in changes] +
                      [desired.digest(), current], ensure_ascii=True)
    return sha256_digest(body.encode("ascii"))


def paths_that_differ(confirmed: Sequence[Change], now: Sequence[Change]) -> list[str]:
    """The paths whose planned changes (kind, origin, live and desired attributes) differ
    between a confirmed plan of one host and its plan now, sorted."""

    def by_path(changes: Sequence[Change]) -> dict[str, list[str]]:
        out: dict[str, list[str]] = {}
        for c in changes:
            out.setdefault(c.path, []).append(json.dumps(
                [c.change, c.origin, c.live and c.live.to_json(),
                 c.desired and c.desired.to_json()], sort_keys=True))
        return {path: sorted(keys) for path, keys in out.items()}

    before, after = by_path(confirmed), by_path(now)
    return sorted(p for p in set(before) | set(after) if before.get(p) != after.get(p))


def plan_ship(host: Host, state: LiveState, desired: Manifest, changes: list[Change],
              found: Ancestry, accounts: list[str], options: PlanOptions,
              account_stops: Sequence[str] = ()) -> ShipPlan:
    """Decide what a ship of ``host`` does, from its scan; no I/O.

    Args:
        host: the inventory entry the ship came through.
        state: the host's scan.
        desired: the desired manifest with the host's default owner filled in.
        changes: the changes between live and desired, with origins.
        found: how the source relates to the host's commit.
        accounts: what the ship would create for the agents' accounts (one line each).
        options: the options that change the decision.
        account_stops: the accounts the host's users step would stop on (an agent user with
            uid 0, another HOME in /etc/passwd, a HOME that is not a directory).

    The checks, in order: the host's identity, its layout, accounts the ship cannot make
    right, an incomplete scan (exit 2); hand-
    patches not overridden, a stale checkout, a plan other than the one confirmed (exit 3).
    """
    common: dict[str, Any] = dict(changes=tuple(changes), ancestry=found,
                                  accounts=tuple(accounts),
                                  digest=plan_digest(changes, desired, state.current))
    problem = identity_problem(host, state, options.renamed_from)
    if problem:
        return ShipPlan(host.name, ERROR, reason=problem[0], hint=problem[1], step="scan",
                        identity_problem=True, **common)
    layout = layout_problem(host, state)
    if layout:  # the host-side program refuses this itself; a dry run must say the same
        return ShipPlan(host.name, ERROR, reason=layout, step="scan", **common)
    if account_stops:  # the same, and stopping here sends nothing and creates no root
        return ShipPlan(host.name, ERROR, reason="; ".join(account_stops), step="users",
                        hint="fix the agent's user: or home: in the inventory (or the account "
                        "on the host); nothing was written", **common)
    if state.unreadable:
        return ShipPlan(host.name, INCOMPLETE, reason=f"{len(state.unreadable)} path(s) could "
                        "not be read; refusing to ship over a tree that was not fully seen",
                        step="scan", **common)
    changed_on_host = [c for c in changes if c.origin in REFUSED_ORIGINS]
    blocked = [c for c in changed_on_host if not options.forces(c.path)]
    if blocked:
        paths = sorted({show_name(c.path) for c in blocked})
        shown = ", ".join(paths[:5]) + (f" and {len(paths) - 5} more" if len(paths) > 5 else "")
        secret_only = all(is_credential_path(c.path) for c in blocked)
        return ShipPlan(
            host.name, REFUSED, step="plan",
            reason=f"{len(paths)} path(s) would lose changes made on the host "
            f"({', '.join(sorted({c.origin for c in blocked}))}): {shown}",
            hint="review with `fleetctl drift --diff`; a credential file changed on the host is "
            "never backported: ship with --force-path PATH to put the granted one back"
            if secret_only else "review with `fleetctl drift --diff`, then `fleetctl backport "
            f"{host.name}` to bring the hand-patch into the blueprint, or ship with "
            "--force-path PATH (or --force) to overwrite it", **common)
    no_op = not changes and state.shipped == desired and not accounts
    if found.stale and not options.force and not no_op:
        return ShipPlan(host.name, REFUSED, step="plan", reason=f"stale checkout: "
                        f"{found.describe()}", hint=_stale_hint(found),
                        **common)
    if options.approved is not None and options.approved != common["digest"]:
        differ = paths_that_differ(options.confirmed, changes)
        what = (f": {len(differ)} path(s) differ from the confirmed plan" + "".join(
            f"\n  {show_name(path)}" for path in differ)) if differ else \
            " (the release in use or the desired tree is not the one confirmed)"
        return ShipPlan(host.name, REFUSED, step="plan", reason="the host changed after the "
                        f"plan was confirmed; nothing was shipped{what}",
                        hint="run ship again to see the new plan", **common)
    if no_op:
        return ShipPlan(host.name, NO_OP, **common)
    copies, sends = content_plan(desired, state.live)
    return ShipPlan(host.name, READY, copies=tuple(sorted(copies.items())), sends=tuple(sends),
                    secrets=tuple(secret_plan(desired, state.live)),
                    forced_paths=tuple(sorted({c.path for c in changed_on_host})), **common)


def _stale_hint(found: Ancestry) -> str:
    if found.relation == "unknown" and found.source_commit is None:
        return ("ship from the git checkout the fleet was shipped from; --force ships this "
                "source anyway and records that")
    if found.relation == "unknown":
        return "run `git fetch` and check out the commit the fleet runs (or a descendant)"
    return ("update the checkout (git pull) and ship again; going back on purpose is a "
            "rollback; --force ships it anyway and records that")


def identity_problem(host: Host, state: LiveState,
                     renamed_from: str | None = None) -> tuple[str, str] | None:
    """Why the host reached is not the one the inventory entry names: ``(message, hint)``.

    ``None`` when it records this name, or none yet (it is adopted by its next ship), or when
    it records ``renamed_from`` (a deliberate rename: the ship records the new name).
    """
    ident = state.identity
    if ident is None:
        return None
    where = f"{host.name} ({describe_target(host)})"
    if "problem" in ident:
        return (f"{where}: the host identity cannot be read: {ident['problem']}",
                "fix or remove the file on the host after checking which host this is")
    name = ident.get("name")
    if name == host.name or (renamed_from is not None and name == renamed_from):
        return None
    return (f"{where} reaches a host that records itself as {name!r} (id {ident.get('id')}), "
            f"not {host.name!r}: the inventory entry points at another host; nothing was "
            "written",
            f"check the address, port and root of {host.name!r} in the inventory; if the host "
            f"was renamed on purpose, ship it with --renamed-from {name}")


def describe_target(host: Host) -> str:
    """Where an inventory entry leads: ``local /root`` or ``user@address:port /root``."""
    if host.transport == "local":
        return f"local {host.root}"
    port = f":{host.port}" if host.port else ""
    return f"{host.user + '@' if host.user else ''}{host.address}{port} {host.root}"


LAYOUT_KINDS = ("dir", "other")


def layout_problem(host: Host, state: LiveState) -> str | None:
    """Why a ship cannot replace this host's ``current`` (the host-side check, for dry runs)."""
    if state.current_kind not in LAYOUT_KINDS:
        return None
    what = "directory" if state.current_kind == "dir" else "file or special file"
    return (f"{host.root}/current is a {what}, not a release symlink; move it aside to adopt "
            "this host")


def content_plan(desired: Manifest, live: Manifest) -> tuple[dict[str, str], list[str]]:
    """Return (path → live path to copy from, digests to send) for the release tree.

    Prefers the same path. Credential files are not part of it (:func:`secret_plan`).
    """
    have: dict[str, str] = {}
    for entry in live:
        if entry.type == FILE and entry.digest is not None \
                and not is_credential_path(entry.path):
            have.setdefault(entry.digest, entry.path)
    sources: dict[str, str] = {}
    blobs: list[str] = []
    for entry in desired:
        # A rendered file always has a digest; only an unchecked grant's (drift) has none.
        if entry.type != FILE or entry.digest is None or is_credential_path(entry.path):
            continue
        same = live.get(entry.path)
        if same is not None and same.type == FILE and same.digest == entry.digest:
            sources[entry.path] = entry.path
        elif entry.digest in have:
            sources[entry.path] = have[entry.digest]
        elif entry.digest not in blobs:
            blobs.append(entry.digest)
    return sources, blobs


def secret_plan(desired: Manifest, live: Manifest) -> list[str]:
    """Digests of the credential files the host must write (new content or new path)."""
    wanted: list[str] = []
    for entry in desired:
        # An unchecked grant's file (drift) has no digest, and drift makes no plan.
        if entry.type != FILE or entry.digest is None or not is_credential_path(entry.path):
            continue
        same = live.get(entry.path)
        if (same is None or same.type != FILE or same.digest != entry.digest) and \
                entry.digest not in wanted:
            wanted.append(entry.digest)
    return wanted

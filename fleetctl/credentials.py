"""Rendering each agent's granted credentials: the host's credentials tree (DESIGN.md §5, inv. 6).

Credential files live beside the releases, never inside one, so no old release ever holds a
secret and a rotation or revocation leaves no copy behind::

    <root>/credentials/                     0755, the host's default owner
    <root>/credentials/<agent>/             0700, the agent's own user and group
    <root>/credentials/<agent>/<file>       0600, the agent's own user and group

In manifests and reports these paths are ``credentials/<agent>/<file>``, beside the release
tree's ``runner/``, ``skills/`` and ``agents/`` (which can never start with ``credentials``).
Only granted capabilities render, one file per template of the capability. The rendered bytes
are held as :class:`~fleetctl.secrets.Secret` values: drift, plans and reports see digests.

A grant whose secret source gives no value (an unset variable, a missing program, an unreadable
file) stops a ship, which names every such grant before it contacts the host. Drift and the
audits instead render it as *unchecked* (:class:`UncheckedGrant`): its files are in the desired
tree with their path, mode and owner but no digest, and the scan compares their content with the
shipped record alone (:func:`fleetctl.scan.desired_for`), so a hand-patch is still found.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from fleetctl.blueprint import Blueprint
from fleetctl.errors import InputError
from fleetctl.inventory import Agent, Host
from fleetctl.manifest import DIR, FILE, Entry, sha256_digest
from fleetctl.protocol import CREDENTIALS_TOP as CREDENTIALS_TOP
from fleetctl.protocol import LEFTOVER_PREFIX as LEFTOVER_PREFIX
from fleetctl.protocol import is_credential_path as is_credential_path
from fleetctl.secrets import REDACTED, Secret, SecretStore, SecretUnavailable, source_kind
from fleetctl.templating import render_template
from fleetctl.yamlfile import display_path

# CREDENTIALS_TOP, LEFTOVER_PREFIX and is_credential_path (where credentials live, how a
# leftover of an interrupted ship is named) are the host's rules too: defined once, in
# fleetctl.protocol, and re-exported here for the client's modules.
TOP_MODE = "0755"
DIR_MODE = "0700"
FILE_MODE = "0600"


def credentials_dir(host: Host, agent: Agent) -> str | None:
    """The agent's credentials directory on the host (absolute), or ``None`` without grants."""
    return f"{host.root}/{CREDENTIALS_TOP}/{agent.name}" if agent.grants else None


@dataclass(frozen=True, slots=True)
class UncheckedGrant:
    """A grant whose secret was not available, so its files could not be rendered.

    Attributes:
        agent: the agent's name.
        capability: the granted capability.
        source: the kind of the secret source: ``env``, ``file`` or ``command``.
        source_name: how the source is named (``environment variable GH_TOKEN``, ``file
            secrets/gh``, ``command pass``); never a value.
        reason: why it gave no value (the source's error message; never a value).
        where: ``file:line: key.path`` of the grant in the inventory.
        paths: the credential files the grant renders (``credentials/<agent>/<file>``).
        hint: the source's own fix, when it has one (``chmod 600 PATH`` for a secret file
            others can read); ``None`` otherwise.
    """

    agent: str
    capability: str
    source: str
    source_name: str
    reason: str
    where: str
    paths: tuple[str, ...]
    hint: str | None = None

    def describe(self) -> str:
        """One line for people: grant, agent, source, reason and the source's fix."""
        return (f"grant {self.capability} of agent {self.agent} ({self.where}): {self.reason}"
                + (f" (fix: {self.hint})" if self.hint else ""))

    def to_json(self) -> dict[str, Any]:
        """``{agent, capability, source, source_name, reason, where, paths}``."""
        return {"agent": self.agent, "capability": self.capability, "source": self.source,
                "source_name": self.source_name, "reason": self.reason, "where": self.where,
                "paths": list(self.paths)}


class SecretsMissing(InputError):
    """Secrets a ship must write are not available; ``unchecked`` lists each grant."""

    def __init__(self, host: str, unchecked: list[UncheckedGrant]) -> None:
        self.unchecked = list(unchecked)
        # One grant a line: with several missing, a person reads down the list, and each line
        # says which agent and grant needs the source and where the inventory names it.
        shown = "".join(f"\n  {u.describe()}" for u in unchecked)
        fixes = list(dict.fromkeys(u.hint for u in unchecked if u.hint))
        super().__init__(
            f"{host}: {len(unchecked)} secret(s) needed for its credential files are not "
            f"available, so nothing was sent to the host:{shown}",
            hint="; ".join(fixes + ["make every secret source of this host available (set "
                                    "the variable, install the program, fix the file) and "
                                    "ship again; drift and creds audit work without them"]))


@dataclass(frozen=True, slots=True)
class CredentialTree:
    """The credential files of one host.

    Attributes:
        entries: manifest entries (``credentials``, ``credentials/<agent>``, its files); owners
            are ``None`` where the host's default owner applies (an agent without a user).
        secrets: file content by digest (``"sha256:..."``), as secrets.
        files: ``credentials/<agent>/<file>`` → ``(agent, capability)``, for reports.
        unchecked: the grants whose secret was not available (only with ``missing_ok``); their
            files are in ``entries`` without a digest.
    """

    entries: list[Entry] = field(default_factory=list)
    secrets: dict[str, Secret] = field(default_factory=dict)
    files: dict[str, tuple[str, str]] = field(default_factory=dict)
    unchecked: list[UncheckedGrant] = field(default_factory=list)


def render_credentials(blueprint: Blueprint, host: Host,
                       agent_context: Any, missing_ok: bool = False) -> CredentialTree:
    """Render every grant of every agent of ``host``.

    Args:
        blueprint: the loaded blueprint (its capabilities).
        host: the host; its ``secrets`` store resolves each grant's secret once per run.
        agent_context: ``(blueprint, host, agent) -> dict``, the template variables of an agent
            (``fleetctl.render.agent_context``); ``secret`` and ``scope`` are added to them.
        missing_ok: ``True`` (drift, audits): a grant whose secret is not available is listed
            in ``unchecked`` and its files get entries without a digest. ``False`` (ship,
            default): every grant is tried, then :class:`SecretsMissing` names all that failed.

    Raises:
        SecretsMissing: without ``missing_ok``, one or more secrets are not available.
        InputError: a grant of a capability the blueprint lacks, a secret that is not UTF-8
            text, a template error (any copy of the secret in its message is replaced by
            ``[redacted]``), or two capabilities rendering one file name.
    """

    tree = CredentialTree()
    store = host.secrets or SecretStore(blueprint.root)
    granted = [a for a in host.agents if a.grants]
    if not granted:
        return tree
    tree.entries.append(Entry(CREDENTIALS_TOP, DIR, mode=TOP_MODE))
    for agent in granted:
        base = f"{CREDENTIALS_TOP}/{agent.name}"
        tree.entries.append(Entry(base, DIR, mode=DIR_MODE, owner=agent.owner))
        for grant in agent.grants:
            capability = blueprint.capabilities.get(grant.capability)
            if capability is None:
                raise InputError(f"{grant.where}: no capability {grant.capability!r} in the "
                                 "blueprint")
            unavailable = None
            try:
                secret = store.resolve(grant.secret)
            except SecretUnavailable as exc:
                unavailable = exc
            if unavailable is not None:
                _add_unchecked(tree, host, agent, grant, capability, unavailable)
                continue
            try:
                text = secret.reveal().decode("utf-8")
            except UnicodeDecodeError:
                raise InputError(f"{grant.where}: secret: the value is not UTF-8 text, so a "
                                 "template cannot hold it") from None
            context = {**agent_context(blueprint, host, agent), "secret": text,
                       "scope": grant.scope}
            for name, template in capability.templates.items():
                path = f"{base}/{name}"
                if path in tree.files:
                    other = tree.files[path][1]
                    raise InputError(f"{grant.where}: capability {grant.capability!r} renders "
                                     f"{name!r}, which capability {other!r} also renders for "
                                     f"agent {agent.name}")
                where = display_path(template)
                try:
                    data = render_template(template.read_bytes(), where, context)
                except InputError as exc:
                    raise InputError(_redact(exc.message, text),
                                     hint=exc.hint and _redact(exc.hint, text)) from None
                except OSError as exc:
                    raise InputError(f"{where}: cannot read: {exc.strerror}") from None
                digest = sha256_digest(data)
                tree.secrets[digest] = Secret(data)
                tree.files[path] = (agent.name, grant.capability)
                # No size: a credential is known by its digest alone (records, reports).
                tree.entries.append(Entry(path, FILE, mode=FILE_MODE, owner=agent.owner,
                                          digest=digest))
    if tree.unchecked and not missing_ok:
        raise SecretsMissing(host.name, tree.unchecked)
    return tree


def _add_unchecked(tree: CredentialTree, host: Host, agent: Agent, grant: Any, capability: Any,
                   exc: SecretUnavailable) -> None:
    """Record a grant whose secret is not available; its files get entries without digest."""
    base = f"{CREDENTIALS_TOP}/{agent.name}"
    paths = []
    for name in capability.templates:
        path = f"{base}/{name}"
        if path in tree.files:
            other = tree.files[path][1]
            raise InputError(f"{grant.where}: capability {grant.capability!r} renders "
                             f"{name!r}, which capability {other!r} also renders for "
                             f"agent {agent.name}")
        tree.files[path] = (agent.name, grant.capability)
        tree.entries.append(Entry(path, FILE, mode=FILE_MODE, owner=agent.owner))
        paths.append(path)
    source = exc.source if exc.source is not None else grant.secret
    tree.unchecked.append(UncheckedGrant(agent.name, grant.capability, source_kind(source),
                                         source.describe(), exc.message, grant.where,
                                         tuple(paths), exc.hint))


def _redact(message: str, secret: str) -> str:
    return message.replace(secret, REDACTED) if secret else message

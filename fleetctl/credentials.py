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
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from fleetctl.blueprint import Blueprint
from fleetctl.errors import InputError
from fleetctl.inventory import Agent, Host
from fleetctl.manifest import DIR, FILE, Entry, sha256_digest
from fleetctl.secrets import REDACTED, Secret, SecretStore
from fleetctl.yamlfile import display_path

CREDENTIALS_TOP = "credentials"
TOP_MODE = "0755"
DIR_MODE = "0700"
FILE_MODE = "0600"
#: The name prefix of a credential file a ship writes before renaming it into place; one left
#: behind by an interrupted ship is fleetctl's own (drift origin ``pending``).
LEFTOVER_PREFIX = ".fleetctl-new-"


def is_credential_path(path: str) -> bool:
    """Whether a manifest path belongs to the credentials tree (not to a release)."""
    return path == CREDENTIALS_TOP or path.startswith(CREDENTIALS_TOP + "/")


def credentials_dir(host: Host, agent: Agent) -> str | None:
    """The agent's credentials directory on the host (absolute), or ``None`` without grants."""
    return f"{host.root}/{CREDENTIALS_TOP}/{agent.name}" if agent.grants else None


@dataclass(frozen=True, slots=True)
class CredentialTree:
    """The credential files of one host.

    Attributes:
        entries: manifest entries (``credentials``, ``credentials/<agent>``, its files); owners
            are ``None`` where the host's default owner applies (an agent without a user).
        secrets: file content by digest (``"sha256:..."``), as secrets.
        files: ``credentials/<agent>/<file>`` → ``(agent, capability)``, for reports.
    """

    entries: list[Entry] = field(default_factory=list)
    secrets: dict[str, Secret] = field(default_factory=dict)
    files: dict[str, tuple[str, str]] = field(default_factory=dict)


def render_credentials(blueprint: Blueprint, host: Host,
                       agent_context: Any) -> CredentialTree:
    """Render every grant of every agent of ``host``.

    Args:
        blueprint: the loaded blueprint (its capabilities).
        host: the host; its ``secrets`` store resolves each grant's secret once per run.
        agent_context: ``(blueprint, host, agent) -> dict``, the template variables of an agent
            (``fleetctl.render.agent_context``); ``secret`` and ``scope`` are added to them.

    Raises:
        InputError: a grant of a capability the blueprint lacks, a secret that cannot be
            resolved or is not UTF-8 text, a template error (any copy of the secret in its
            message is replaced by ``[redacted]``), or two capabilities rendering one file name.
    """
    from fleetctl.render import render_template  # render imports this module

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
            try:
                secret = store.resolve(grant.secret)
            except InputError as exc:  # say which grant, beside which source
                raise InputError(f"{grant.where}: {exc.message}", hint=exc.hint) from None
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
    return tree


def _redact(message: str, secret: str) -> str:
    return message.replace(secret, REDACTED) if secret else message

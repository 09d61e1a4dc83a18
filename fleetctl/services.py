"""The runners' systemd units: rendered per agent, installed by ``ship`` on systemd hosts.

A host whose inventory says ``service: systemd`` gets one unit per agent,
``fleet-runner-<agent>.service``, rendered from ``templates/fleet-runner.service.j2`` with the
same variables as the agent's config (:func:`fleetctl.render.agent_context`). Units live in the
host's ``systemd_unit_dir``, outside the managed root: they are not part of the desired tree, of
a release, or of drift. The ship's ``services`` step (``fleetctl/host/services.py``, after the
switch) writes the units that differ, removes ``fleet-runner-*.service`` files no agent wants any
more, and enables and (re)starts every wanted unit; ``docs/layout.md`` describes it.
"""

from __future__ import annotations

import re
from typing import Any

from fleetctl.blueprint import Blueprint
from fleetctl.errors import InputError
from fleetctl.inventory import Host
from fleetctl.manifest import sha256_digest
from fleetctl.protocol import UNIT_PREFIX, UNIT_SUFFIX
from fleetctl.render import agent_context
from fleetctl.templating import render_template

UNIT_TEMPLATE = "fleet-runner.service.j2"

# What may be substituted into a unit file unquoted or inside "...": systemd gives meaning to
# %, $, quotes, backslashes and whitespace in unit files, so a value carrying one is refused
# rather than rendered into a unit that systemd would read differently.
_UNIT_PATH = re.compile(r"^/[A-Za-z0-9/._+:@-]*$")


def unit_name(agent: str) -> str:
    """The unit file name of an agent's runner: ``fleet-runner-<agent>.service``."""
    return f"{UNIT_PREFIX}{agent}{UNIT_SUFFIX}"


def _check_unit_values(host: Host) -> None:
    if not _UNIT_PATH.fullmatch(host.root):
        raise InputError(f"hosts.{host.name}.root: {host.root!r} cannot go into a systemd unit",
                         hint="with service: systemd the root may hold only letters, digits "
                         "and / . _ + : @ -")
    for agent in host.agents:
        # user and group are checked by the inventory (what useradd accepts); the HOME is any
        # absolute path there, so here it must also be one systemd reads as written.
        if agent.home is not None and not _UNIT_PATH.fullmatch(agent.home):
            raise InputError(
                f"hosts.{host.name}.agents.{agent.name}.home: {agent.home!r} cannot go into a "
                "systemd unit", hint="a home is an absolute path of letters, digits and "
                "/ . _ + : @ -")


def render_units(blueprint: Blueprint, host: Host) -> dict[str, bytes] | None:
    """Render the runner units of ``host``: unit file name → content, in agent order.

    Returns ``None`` for a host whose ``service`` is not ``systemd`` (fleetctl then leaves its
    services alone); an empty mapping for a systemd host without agents (ship then removes any
    ``fleet-runner-*.service`` left from earlier agents).

    Raises:
        InputError: the template cannot be read or fails to render, or a value that goes into
            the unit (root, an agent's user, group or home) is one systemd would misread.
    """
    if host.service != "systemd":
        return None
    _check_unit_values(host)
    path = blueprint.templates / UNIT_TEMPLATE
    try:
        source = path.read_bytes()
    except OSError as exc:
        raise InputError(f"{path}: cannot read the runner unit template: {exc.strerror}",
                         hint=f"host {host.name} has service: systemd") from None
    return {unit_name(agent.name): render_template(source, f"templates/{UNIT_TEMPLATE}",
                                                   agent_context(blueprint, host, agent))
            for agent in host.agents}


def services_request(host: Host, units: dict[str, bytes], with_content: bool) -> dict[str, Any]:
    """The part of a host-side request or ship command that concerns services.

    Args:
        host: the host (its ``systemd_unit_dir`` and ``systemctl``).
        units: the rendered units (:func:`render_units`).
        with_content: send each unit's text (a ship) or only its digest (a dry run's read-only
            probe of which units differ).
    """
    if with_content:
        wanted: dict[str, str] = {name: data.decode("utf-8") for name, data in units.items()}
    else:
        wanted = {name: sha256_digest(data) for name, data in units.items()}
    return {"units": wanted, "unit_dir": host.systemd_unit_dir, "systemctl": host.systemctl}

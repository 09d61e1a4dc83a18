"""Exact token counts of the runner's prompt prefix, made where the tokenizer is: at render.

Hosts get no pip installs, so the runner cannot count ``o200k_base`` tokens itself (its own
counter is a labelled bytes/4 estimate, :mod:`fleet_runner.tokens`). But the runner's text
components (role prompt, skills index, CLI index) depend only on the release, so fleetctl builds
them at render time with the same prefix builder the runner uses (docs/invariants.md, invariant 9),
counts them with the offline encoder, and ships the counts beside the agent's config::

    agents/<agent>/prefix-tokens.json
    {"schema_version": 1, "counter": "o200k_base", "data_sha256": "446a…",
     "components": {"role_prompt": {"sha256": "…", "tokens": 41}, ...}}

The runner uses a component's count only when the text it built has that sha256; otherwise it
falls back to its estimate and says so. Only fields that make the counts (encoding and data
digest, never library versions) are in the file, so two operators' renders are identical.
"""

from __future__ import annotations

import functools
import hashlib
import json
from pathlib import Path

from fleetctl.blueprint import Blueprint, Role

PREFIX_COUNTS = "prefix-tokens.json"
SCHEMA_VERSION = 1


@functools.lru_cache(maxsize=1)
def _counter():
    from fleetctl.tokencount.counters import O200kCounter

    return O200kCounter()


def prefix_counts(blueprint: Blueprint, role: Role) -> bytes | None:
    """The ``prefix-tokens.json`` content for an agent of ``role``, or ``None`` when the
    blueprint has no runner prefix builder (then the runner only estimates).

    Raises:
        InputError: the prefix builder does not import, or the role's prefix cannot be built
            (a skill without its directory); TokenizerError: the offline encoder or its data
            cannot be loaded or verified.
    """
    if not (Path(blueprint.root) / "runner" / "fleet_runner" / "prefix.py").is_file():
        return None
    from fleetctl.errors import InputError
    from fleetctl.roledecl import bridged_servers
    from fleetctl.tokencount.prefixmodule import load_prefix_module

    module = load_prefix_module(blueprint.root)
    try:
        prefix = module.build_prefix(role.prompt, role.skills, Path(blueprint.root) / "skills",
                                     bridged_servers=bridged_servers(role.mcp_servers))
    except module.PrefixError as exc:
        raise InputError(f"cannot build the runner's prefix: {exc}") from None
    counter = _counter()
    components = {name: {"sha256": hashlib.sha256(text.encode("utf-8", "surrogateescape"))
                         .hexdigest(), "tokens": counter.count(text)}
                  for name, text in prefix.components.items()}
    provenance = counter.provenance()
    body = {"schema_version": SCHEMA_VERSION, "counter": counter.name,
            "data_sha256": provenance.get("data_sha256"),
            "components": components}
    return (json.dumps(body, indent=1, sort_keys=True) + "\n").encode("utf-8")

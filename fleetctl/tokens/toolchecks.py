"""Checks on an MCP server's listed tools that flag a problem without stopping the measurement.

Each class comes from public bug reports against MCP clients and providers:

- **a name listed twice** (on two pages, or twice on one): the model gets one definition per
  name (a provider refuses duplicate names), so the tool is counted once, the first listing
  kept, and flagged;
- **a name providers reject**: the Messages API (Anthropic, "Tool use", ``name``: must match
  ``^[a-zA-Z0-9_-]{1,64}$``) and OpenAI's function calling take letters, digits, ``_`` and ``-``,
  at most 64 characters; a dot, a slash or a longer name is flagged (for the name the model
  receives, ``mcp__SERVER__TOOL``, and the tool's own);
- **names that collide once normalised**: clients replace the characters a provider rejects
  with ``_`` (``get.issue`` and ``get_issue`` both become ``get_issue``): one of them is then
  unreachable;
- **an input schema whose root is** ``anyOf``/``oneOf``/``allOf``: the Messages API rejects it
  ("input_schema does not support oneOf, allOf, or anyOf at the top level"); the tool is still
  counted, the rest unaffected.
"""

from __future__ import annotations

import re
from dataclasses import replace
from typing import Any

PROVIDER_NAME = re.compile(r"^[a-zA-Z0-9_-]{1,64}$")
_INVALID = re.compile(r"[^a-zA-Z0-9_-]")
SENT_NAME = "mcp__{server}__{tool}"


def normalised(name: str) -> str:
    """A tool name with every character a provider rejects replaced by ``_``."""
    return _INVALID.sub("_", name)


def check_tools(server: str, tools: list[dict[str, Any]]) -> tuple[list[dict[str, Any]],
                                                                   list[str]]:
    """The tools with repeated names dropped (first kept), and one flag per problem found.

    Args:
        server: the server's name in the role (for the name the model receives).
        tools: the tools as listed (JSON objects with a string ``name``).

    Returns:
        ``(tools, flags)``: each flag one line for people.
    """
    kept: list[dict[str, Any]] = []
    seen: dict[str, int] = {}
    for tool in tools:
        name = tool["name"]
        seen[name] = seen.get(name, 0) + 1
        if seen[name] == 1:
            kept.append(tool)
    flags = [f"tool {name!r} is listed {n} times: counted once (the first listing)"
             for name, n in seen.items() if n > 1]
    by_normal: dict[str, list[str]] = {}
    for tool in kept:
        name = tool["name"]
        sent = SENT_NAME.format(server=server, tool=name)
        if not PROVIDER_NAME.fullmatch(name) or not PROVIDER_NAME.fullmatch(sent):
            why = []
            bad = sorted(set(_INVALID.findall(name)))
            if bad:
                why.append("characters " + " ".join(repr(c) for c in bad))
            if len(sent) > 64:
                why.append(f"{len(sent)} characters as {sent} (over 64)")
            flags.append(f"tool {name!r}: name rejected by some providers "
                         f"({'; '.join(why) or 'empty'}): they take [a-zA-Z0-9_-]{{1,64}}")
        by_normal.setdefault(normalised(name), []).append(name)
    for norm, names in by_normal.items():
        if len(names) > 1:
            flags.append(f"tools {', '.join(repr(n) for n in names)} collide once normalised "
                         f"(all become {norm!r}): only one is reachable")
    for tool in kept:
        schema = tool.get("inputSchema")
        if isinstance(schema, dict):
            roots = [k for k in ("anyOf", "oneOf", "allOf") if k in schema]
            if roots:
                flags.append(f"tool {tool['name']!r}: input schema root is {roots[0]}: "
                             "rejected by some providers (the Messages API: \"input_schema "
                             "does not support oneOf, allOf, or anyOf at the top level\")")
    return kept, flags


def checked(listing: Any) -> Any:
    """A :class:`fleetctl.tokens.mcp_list.ServerListing` with its tools checked: repeated
    names dropped, ``flags`` set."""
    if not listing.tools:
        return listing
    tools, flags = check_tools(listing.name, list(listing.tools))
    return replace(listing, tools=tuple(tools), flags=tuple(flags))

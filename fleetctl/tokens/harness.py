"""Harness profiles: what an agent CLI adds to every turn, measured once, kept as counts.

The runner's prefix (role prompt, skills index, CLI index) is only part of what the model
receives. The agent harness the runner starts (``claude -p``) sends its own system prompt, the
definitions of its built-in tools, and reminders in the first user message. A **harness
profile** is that part, measured by probing the harness against a local endpoint
(:mod:`fleetctl.tokens.probe`) and kept in the blueprint as counts and digests, never the text
(the text is the harness vendor's)::

    blueprint/harnesses/claude-code-2.1.197-tools-Bash.json
    {"schema_version": 1, "harness": "claude-code", "version": "2.1.197",
     "toolset": "tools-Bash", "tools_declared": ["Bash"],
     "counter": "o200k_base", "data_sha256": "446a…",
     "components": {"system_prompt": {"tokens": 1302, "sha256": "…", "blocks": 3},
                    "tools": {"tokens": 671, "sha256": "…", "count": 1},
                    "reminders": {"tokens": 1490, "sha256": "…", "blocks": 2}},
     "tools": [{"name": "Bash", "tokens": 670, "sha256": "…"}],
     "total_tokens": 3463,
     "probe": {"model": "…", "stream": true, "requests": 1, "mcp_tools_seen": 0}}

What each component is, in the first ``/v1/messages`` request the harness sent:

- ``system_prompt``: every text block of ``system`` (or the string), each counted, summed;
- ``tools``: the ``tools`` array of the built-in tools (names not starting ``mcp__``) as JSON,
  each tool as ``{"name", "description", "input_schema"}`` (what the model reads; transport
  fields like ``cache_control`` are left out), the same way the audit counts MCP tools;
  ``tools[]`` has each tool's own count (its JSON alone);
- ``reminders``: the text of every message block except the probe's prompt (removed from the
  block that holds it): the fixed part of the first message. It holds the date, so its digest
  changes from day to day; its count barely.

Tools named ``mcp__…`` come from MCP servers: the audit counts those itself from their listings,
so a profile never holds them (``mcp_tools_seen`` says how many the probe saw).

Profiles are looked up by harness, tool set (:func:`fleetctl.roledecl.toolset_key`) and
version: a role's pinned version (``harness: claude-code@2.1.197``), else the newest profiled.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fleetctl.errors import InputError

SCHEMA_VERSION = 1
PROFILE_DIR = "harnesses"
"""Where profiles live in the blueprint (``blueprint/harnesses/``)."""

MCP_PREFIX = "mcp__"
COMPONENTS = ("system_prompt", "tools", "reminders")
"""A profile's components, in report order (rows ``harness_<name>`` in the audit)."""

_VERSION = re.compile(r"\d+(?:\.\d+)+")
_FILE = re.compile(r"^(?P<harness>[a-z0-9-]+?)-(?P<version>\d+(?:\.\d+)+)-(?P<toolset>.+)\.json$")


class ProfileError(InputError):
    """A harness profile cannot be made from a request, or a profile file is not valid."""


def digest(value: Any) -> str:
    """``sha256:`` of a value's canonical JSON (a text: its UTF-8 bytes)."""
    data = value if isinstance(value, str) else json.dumps(
        value, sort_keys=True, ensure_ascii=False, separators=(",", ":"))
    return "sha256:" + hashlib.sha256(data.encode("utf-8", "surrogateescape")).hexdigest()


def sent_tool(tool: dict[str, Any]) -> dict[str, Any]:
    """A tool of the request as the model reads it: ``name``, ``description``, ``input_schema``."""
    return {k: tool[k] for k in ("name", "description", "input_schema") if k in tool}


def tool_text(tool: dict[str, Any]) -> str:
    """One tool's JSON as counted: compact, UTF-8 kept (as ``prefix.tool_json``)."""
    return json.dumps(sent_tool(tool), ensure_ascii=False, separators=(",", ":"))


def _blocks(content: Any) -> list[str]:
    """The texts of a message's or system's content: a string, or text blocks."""
    if isinstance(content, str):
        return [content]
    out = []
    for block in content if isinstance(content, list) else []:
        if isinstance(block, dict) and isinstance(block.get("text"), str):
            out.append(block["text"])
    return out


@dataclass(frozen=True, slots=True)
class Profile:
    """One harness profile (the JSON document in the module docstring).

    Attributes:
        harness: its name (``claude-code``).
        version: the harness's version (``2.1.197``).
        toolset: the tool set's key (``default``, ``none``, ``tools-Bash+Read``).
        tools_declared: the built-in tools asked for (``None``: the default set).
        components: name → ``{"tokens": int, "sha256": str, ...}`` for :data:`COMPONENTS`.
        tools: ``[{"name", "tokens", "sha256"}]`` per built-in tool, in the order sent.
        counter: the counter's name and data digest.
        probe: how it was captured (model asked for, streamed, requests seen, MCP tools seen).
        path: the file it was read from, when read.
    """

    harness: str
    version: str
    toolset: str
    tools_declared: tuple[str, ...] | None
    components: dict[str, dict[str, Any]]
    tools: tuple[dict[str, Any], ...]
    counter: dict[str, Any]
    probe: dict[str, Any]
    path: Path | None = None

    @property
    def total_tokens(self) -> int:
        """The harness's part of every turn: the components summed, in tokens."""
        return sum(int(self.components[c]["tokens"]) for c in COMPONENTS)

    def tokens(self, component: str) -> int:
        """One component's tokens."""
        return int(self.components[component]["tokens"])

    @property
    def file_name(self) -> str:
        """``<harness>-<version>-<toolset>.json``."""
        return f"{self.harness}-{self.version}-{self.toolset}.json"

    def to_json(self) -> dict[str, Any]:
        """The profile file's document."""
        return {"schema_version": SCHEMA_VERSION, "harness": self.harness,
                "version": self.version, "toolset": self.toolset,
                "tools_declared": None if self.tools_declared is None
                else list(self.tools_declared),
                "counter": self.counter["name"], "data_sha256": self.counter.get("data_sha256"),
                "components": self.components, "tools": list(self.tools),
                "total_tokens": self.total_tokens, "probe": self.probe}

    def dumps(self) -> str:
        """The profile file's text (sorted keys, one final newline)."""
        return json.dumps(self.to_json(), indent=1, sort_keys=True, ensure_ascii=False) + "\n"


def profile_from_request(body: dict[str, Any], prompt: str, counter: Any, *, harness: str,
                         version: str, toolset: str, tools_declared: list[str] | None,
                         requests: int = 1) -> Profile:
    """Make a profile from the first ``/v1/messages`` request body a harness sent.

    A pure function of the request: the probe records it, this counts it.

    Args:
        body: the request's JSON (``system``, ``tools``, ``messages``...).
        prompt: the user prompt the probe gave the harness (removed from the reminders).
        counter: an exact counter (``O200kCounter``: ``count(text)``, ``name``, ``provenance()``).
        harness, version, toolset, tools_declared: what was probed.
        requests: how many ``/v1/messages`` requests the harness sent in all.

    Raises:
        ProfileError: the body has no ``messages`` list, or the prompt is in none of them (the
            request is not the turn the probe asked for).
    """
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise ProfileError("the harness's request has no messages: not a Messages API turn")
    system_blocks = _blocks(body.get("system"))
    builtin = [t for t in body.get("tools") or [] if isinstance(t, dict)
               and not str(t.get("name", "")).startswith(MCP_PREFIX)]
    mcp_seen = sum(1 for t in body.get("tools") or [] if isinstance(t, dict)
                   and str(t.get("name", "")).startswith(MCP_PREFIX))
    reminders: list[str] = []
    found = False
    wanted = prompt.strip()
    for message in messages:
        for text in _blocks(message.get("content") if isinstance(message, dict) else None):
            if not found and wanted and wanted in text:
                found = True
                text = text.replace(wanted, "", 1)
            if text.strip():
                reminders.append(text)
    if not found:
        raise ProfileError("the probe's prompt is in none of the request's messages: the "
                           "request is not the turn the probe asked for")
    tools_json = "[" + ",".join(tool_text(t) for t in builtin) + "]" if builtin else ""
    provenance = counter.provenance()
    return Profile(
        harness=harness, version=version, toolset=toolset,
        tools_declared=None if tools_declared is None else tuple(tools_declared),
        components={
            "system_prompt": {"tokens": sum(counter.count(t) for t in system_blocks),
                              "sha256": digest(system_blocks), "blocks": len(system_blocks)},
            "tools": {"tokens": counter.count(tools_json),
                      "sha256": digest([sent_tool(t) for t in builtin]), "count": len(builtin)},
            "reminders": {"tokens": sum(counter.count(t) for t in reminders),
                          "sha256": digest(reminders), "blocks": len(reminders)}},
        tools=tuple({"name": str(t.get("name")), "tokens": counter.count(tool_text(t)),
                     "sha256": digest(sent_tool(t))} for t in builtin),
        counter={"name": counter.name, "data_sha256": provenance.get("data_sha256")},
        probe={"model": body.get("model"), "stream": bool(body.get("stream")),
               "requests": requests, "mcp_tools_seen": mcp_seen})


def parse_version(text: str) -> str | None:
    """The first dotted version number in ``text`` (``2.1.197 (Claude Code)`` → ``2.1.197``)."""
    found = _VERSION.search(text or "")
    return found.group(0) if found else None


def _version_key(version: str) -> tuple[int, ...]:
    return tuple(int(p) for p in version.split("."))


def read_profile(path: Path) -> Profile:
    """Read one profile file.

    Raises:
        ProfileError: unreadable, not JSON, or not a profile (the file and the key named).
    """
    try:
        data = json.loads(path.read_text("utf-8"))
    except OSError as exc:
        raise ProfileError(f"{path}: cannot read the harness profile: {exc.strerror}") from None
    except ValueError as exc:
        raise ProfileError(f"{path}: not JSON: {exc}") from None
    try:
        if data.get("schema_version") != SCHEMA_VERSION:
            raise KeyError("schema_version")
        components = {}
        for name in COMPONENTS:
            entry = data["components"][name]
            if not isinstance(entry.get("tokens"), int):
                raise KeyError(f"components.{name}.tokens")
            components[name] = dict(entry)
        tools = tuple(dict(t) for t in data["tools"])
        for i, tool in enumerate(tools):
            if not isinstance(tool.get("name"), str) or not isinstance(tool.get("tokens"), int):
                raise KeyError(f"tools[{i}]")
        declared = data.get("tools_declared")
        return Profile(harness=str(data["harness"]), version=str(data["version"]),
                       toolset=str(data["toolset"]),
                       tools_declared=None if declared is None else tuple(declared),
                       components=components, tools=tools,
                       counter={"name": data.get("counter"),
                                "data_sha256": data.get("data_sha256")},
                       probe=dict(data.get("probe") or {}), path=path)
    except (KeyError, TypeError, AttributeError) as exc:
        key = exc.args[0] if isinstance(exc, KeyError) and exc.args else type(exc).__name__
        raise ProfileError(f"{path}: not a harness profile: {key} missing or of the wrong "
                           "type", hint="make it again with fleetctl tokens --probe") from None


def write_profile(blueprint: Path, profile: Profile) -> Path:
    """Write a profile into ``<blueprint>/harnesses/`` (replacing one of the same name)."""
    directory = Path(blueprint) / PROFILE_DIR
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / profile.file_name
    tmp = path.with_suffix(".tmp")
    tmp.write_text(profile.dumps(), "utf-8")
    tmp.replace(path)
    return path


def find_profile(blueprint: Path, harness: str, toolset: str, version: str | None = None
                 ) -> Profile | None:
    """The profile for ``harness`` and ``toolset``: of ``version`` when given, else the newest
    version profiled; ``None`` when there is none.

    Raises:
        ProfileError: the chosen file is not a valid profile.
    """
    directory = Path(blueprint) / PROFILE_DIR
    candidates = []
    for path in sorted(directory.glob("*.json")) if directory.is_dir() else []:
        match = _FILE.fullmatch(path.name)
        if match and match["harness"] == harness and match["toolset"] == toolset \
                and (version is None or match["version"] == version):
            candidates.append((_version_key(match["version"]), path))
    if not candidates:
        return None
    return read_profile(max(candidates)[1])


HARNESS_ORDER = ("harness_system_prompt", "role_prompt", "skills_index", "cli_index",
                 "mcp_instructions", "harness_tools", "shell_tool", "mcp_tools",
                 "tool_use_system_prompt", "harness_reminders", "joins")
"""Components in report order once the harness's part is in (``harness_*`` from its profile)."""


def with_harness(measurement: Any, profile: Profile, tool_use_tokens: int | None) -> Any:
    """A measurement of the runner's prefix with the harness's part added from its profile.

    The harness's system prompt, built-in tools and first-message reminders become the rows
    ``harness_system_prompt``, ``harness_tools`` and ``harness_reminders`` (method ``profile``),
    each built-in tool a tool of its own (its own count as its marginal cost); the total grows by
    the profile's total. When the runner's prefix had no tool but the harness has some, the
    fixed tool-use prompt (``tool_use_tokens``, from the per-model table) comes in too.

    Args:
        measurement: a :class:`fleetctl.tokens.measure.Measurement` of the runner's prefix,
            built without the runner's own shell tool (the harness's tools replace it).
        profile: the harness profile.
        tool_use_tokens: the tool-use prompt's tokens for the role's model (``None``: unknown).
    """
    from dataclasses import replace

    from fleetctl.tokencount.counters import CLAUDE_ESTIMATE
    from fleetctl.tokens.measure import Component, ToolCost

    where = profile.path.name if profile.path else profile.file_name
    rows = {c.name: c for c in measurement.components}
    added = profile.total_tokens
    old_use = rows["tool_use_system_prompt"]
    if profile.tools and (old_use.tokens or 0) == 0 and old_use.note == "no tools":
        rows["tool_use_system_prompt"] = Component(
            "tool_use_system_prompt", tool_use_tokens, "table",
            "the provider's tokens for the harness's tools, from its table"
            if tool_use_tokens is not None else "unknown model: counted as 0")
        added += tool_use_tokens or 0
    for name in COMPONENTS:
        entry = profile.components[name]
        note = f"{profile.harness} {profile.version}, {profile.toolset}: {where}"
        if name == "tools":
            note = f"{entry.get('count', len(profile.tools))} built-in tools; " + note
        rows[f"harness_{name}"] = Component(f"harness_{name}", int(entry["tokens"]), "profile",
                                            note)
    total = measurement.total_tokens + added
    tools = tuple(ToolCost(str(t["name"]), None, int(t["tokens"])) for t in profile.tools) \
        + measurement.tools
    estimate = measurement.estimate
    if estimate is not None:
        fixed = rows["tool_use_system_prompt"].tokens or 0
        low, high = CLAUDE_ESTIMATE.of(total - fixed)
        estimate = (low + fixed, high + fixed)
    return replace(measurement, total_tokens=total,
                   components=tuple(rows[n] for n in HARNESS_ORDER if n in rows),
                   tools=tools, estimate=estimate)

"""What the agent CLI itself says about its run: its structured result and its transcript.

An agent CLI such as Claude Code (``claude -p --output-format json`` or ``stream-json``) ends
its output with a JSON result object::

    {"type": "result", "subtype": "success", "is_error": false, "result": "...",
     "session_id": "...", "usage": {...},
     "permission_denials": [{"tool_name": "Bash", "tool_use_id": "...",
                             "tool_input": {"command": "rm -rf build"}}]}

and keeps a transcript of the session (``stream-json`` prints it on stdout; the CLI also writes
it to ``$CLAUDE_CONFIG_DIR`` or ``~/.claude``, ``projects/*/SESSION_ID.jsonl``), where a refused
tool call is a ``tool_result`` with ``is_error: true`` and a text such as *"Claude requested
permissions to use Bash, but you haven't granted it yet."*

:func:`read_agent_report` reads all three places. The runner counts a denial from any of them
as a permission denial (the task stops at once), and a result with ``is_error: true`` or an
output with nothing printed as a failed run, whoever sent the task.
"""

from __future__ import annotations

import glob
import json
import os
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

AGENT_CLI = "(agent CLI)"
"""The ``cli`` of a denial the agent CLI reported (the skills' CLIs name themselves)."""
TRANSCRIPT_MAX_BYTES = 32 << 20
"""A transcript larger than this is read only up to it."""
_DENIAL_TEXT = re.compile(
    r"requested permissions? to (?:use (?P<tool>[\w.:-]+)|(?P<verb>write to|edit|read)\b)"
    r"|haven't granted it yet"
    r"|[Pp]ermission to use (?P<tool2>[\w.:-]+)[^\n]{0,200}? (?:has been|was) denied")
_VERB_TOOL = {"write to": "Write", "edit": "Edit", "read": "Read"}


@dataclass(frozen=True, slots=True)
class AgentReport:
    """The agent CLI's own account of a run.

    Attributes:
        printed: whether stdout held anything but whitespace.
        result: whether a structured result object was found.
        is_error: the result's ``is_error`` (``False`` when there is no result).
        subtype: the result's ``subtype`` (``"success"``, ``"error_max_turns"``...), or
            ``None``.
        session_id: the result's ``session_id``, or ``None``.
        denials: every denial found, each ``{"cli", "what", "detail", "source",
            "permission"}``; ``permission`` is the key a standing denial is kept under
            (``tool:Bash``), ``source`` where it was seen (``result``, ``stdout-transcript``,
            ``transcript``).
        cut_off: the output ends in a JSON line that does not parse (and is not one JSON
            document as a whole): the agent CLI was cut off while it printed its result.
    """

    printed: bool
    result: bool = False
    is_error: bool = False
    subtype: str | None = None
    session_id: str | None = None
    denials: list[dict[str, Any]] = field(default_factory=list)
    cut_off: bool = False

    def to_json(self) -> dict[str, Any]:
        """The record form."""
        return {"printed": self.printed, "result": self.result, "is_error": self.is_error,
                "subtype": self.subtype, "session_id": self.session_id,
                "denials": len(self.denials), "cut_off": self.cut_off}


def _json_objects(text: str) -> Iterator[dict[str, Any]]:
    """Each JSON object of ``text``: the whole text when it is one; each object of the whole
    text when it is an array (``claude -p --output-format json`` with ``--verbose``, or with
    ``viewMode: verbose`` in a settings file the agent may write, prints the session's
    messages as one array, the result last: anthropics/claude-code#84784); else one per line."""
    stripped = text.strip()
    if stripped.startswith(("{", "[")):
        try:
            whole = json.loads(stripped)
        except ValueError:
            whole = None
        if isinstance(whole, dict):
            yield whole
            return
        if isinstance(whole, list):
            yield from (item for item in whole if isinstance(item, dict))
            return
    for line in text.split("\n"):  # not splitlines: U+2028 may be raw inside a JSON string
        line = line.strip()
        if not line.startswith("{"):
            continue
        try:
            value = json.loads(line)
        except ValueError:
            continue
        if isinstance(value, dict):
            yield value


def _describe_input(tool_input: Any) -> str:
    if isinstance(tool_input, dict):
        for key in ("command", "file_path", "path", "url", "pattern"):
            if isinstance(tool_input.get(key), str):
                return tool_input[key][:200]
        return json.dumps(tool_input, sort_keys=True)[:200]
    return ""


def _result_denials(result: Mapping[str, Any]) -> list[dict[str, Any]]:
    out = []
    for item in result.get("permission_denials") or []:
        if not isinstance(item, dict):
            continue
        tool = str(item.get("tool_name") or "?")
        shown = _describe_input(item.get("tool_input"))
        out.append({"cli": AGENT_CLI, "what": f"{tool} {shown}".strip(),
                    "detail": "permission_denials in the agent CLI's result",
                    "source": "result", "permission": f"tool:{tool}"})
    return out


def _transcript_denials(entries: Iterator[dict[str, Any]], source: str) -> list[dict[str, Any]]:
    """Refused tool calls in transcript entries: ``tool_result`` blocks with ``is_error`` whose
    text says the permission was refused, named by the ``tool_use`` block they answer (else by
    the text)."""
    listed = list(entries)  # read twice: names first, then the refusals
    names: dict[str, str] = {}
    for entry in listed:
        for block in _blocks(entry):
            if block.get("type") == "tool_use" and isinstance(block.get("id"), str):
                names[block["id"]] = str(block.get("name") or "?")
    out = []
    for entry in listed:
        for block in _blocks(entry):
            if not (block.get("type") == "tool_result" and block.get("is_error")):
                continue
            text = block.get("content")
            if isinstance(text, list):
                text = " ".join(str(b.get("text", "")) for b in text if isinstance(b, dict))
            match = _DENIAL_TEXT.search(str(text or ""))
            if match:
                tool = names.get(str(block.get("tool_use_id"))) or match.group("tool") \
                    or match.group("tool2") or _VERB_TOOL.get(match.group("verb") or "", "?")
                out.append({"cli": AGENT_CLI, "what": f"{tool} (refused tool call)",
                            "detail": str(text)[:300], "source": source,
                            "permission": f"tool:{tool}"})
    return out


def _blocks(entry: dict[str, Any]) -> list[dict[str, Any]]:
    message = entry.get("message")
    content = message.get("content") if isinstance(message, dict) else None
    return [b for b in content if isinstance(b, dict)] if isinstance(content, list) else []


def transcript_path(session_id: str, env: Mapping[str, str]) -> Path | None:
    """The transcript file of session ``session_id`` (``CLAUDE_CONFIG_DIR`` or
    ``HOME/.claude``, ``projects/*/SESSION.jsonl``), or ``None`` when there is none."""
    if not re.fullmatch(r"[A-Za-z0-9_-]{1,128}", session_id):
        return None
    base = env.get("CLAUDE_CONFIG_DIR") or os.path.join(env.get("HOME", ""), ".claude")
    found = sorted(glob.glob(os.path.join(glob.escape(base), "projects", "*",
                                          f"{session_id}.jsonl")))
    return Path(found[0]) if found else None


def read_agent_report(stdout_path: Path, env: Mapping[str, str]) -> AgentReport:
    """Read the agent CLI's result, the transcript on its stdout and the one it saved.

    Args:
        stdout_path: the attempt's captured stdout.
        env: the agent's environment (where its transcript is: ``HOME``,
            ``CLAUDE_CONFIG_DIR``).

    Never raises: what cannot be read is absent from the report.
    """
    try:
        text = Path(stdout_path).read_text("utf-8", "replace")
    except OSError:
        text = ""
    objects = list(_json_objects(text))
    cut_off = _ends_cut_off(text)
    results = [o for o in objects if o.get("type") == "result"
               or ("is_error" in o and ("result" in o or "permission_denials" in o))]
    result = results[-1] if results else None
    denials = _result_denials(result) if result else []
    seen = _transcript_denials(iter(objects), "stdout-transcript")
    session = result.get("session_id") if result else None
    if isinstance(session, str):
        path = transcript_path(session, env)
        if path is not None:
            try:
                with open(path, encoding="utf-8", errors="replace") as fh:
                    saved = fh.read(TRANSCRIPT_MAX_BYTES)
                seen += _transcript_denials(_json_objects_lines(saved), "transcript")
            except OSError:
                pass
    known = {d["permission"] for d in denials}
    for denial in seen:  # the same refusal is in the result and in the transcripts
        if denial["permission"] not in known:
            known.add(denial["permission"])
            denials.append(denial)
    return AgentReport(
        printed=bool(text.strip()), result=result is not None,
        is_error=bool(result.get("is_error")) if result else False,
        subtype=str(result["subtype"]) if result and result.get("subtype") else None,
        session_id=session if isinstance(session, str) else None, denials=denials,
        cut_off=cut_off)


def _ends_cut_off(text: str) -> bool:
    """Whether ``text`` ends in a JSON object or array line that does not parse, while the
    whole text is not one JSON document either (a pretty-printed result)."""
    lines = [ln.strip() for ln in text.split("\n") if ln.strip()]
    if not lines or not lines[-1].startswith(("{", "[")):
        return False
    for candidate in (lines[-1], text.strip()):
        try:
            json.loads(candidate)
        except ValueError:
            continue
        return False
    return True


def _json_objects_lines(text: str) -> Iterator[dict[str, Any]]:
    for line in text.split("\n"):
        try:
            value = json.loads(line)
        except ValueError:
            continue
        if isinstance(value, dict):
            yield value

"""The token ledger: one JSON line per model turn in ``<state>/ledger.jsonl``.

A *model turn*, as the runner sees it, is one run of the agent command (an agent CLI may talk
to its model several times inside it; if it reports that, it is in ``usage``). Each line::

    {
      "schema_version": 1,
      "time": "2026-11-30T01:38:57.332Z",       when the turn ended
      "agent": "concierge", "host": "alpha", "model": "..." | null,
      "task": "m-17", "attempt": 2, "run": "m-17/2",
      "prefix_tokens": {"role_prompt": 41, "skills_index": 30, "cli_index": 28},
      "prefix_tokens_total": 99,
      "task_prompt_tokens": 120,
      "task_prompt_counter": "bytes/4-estimate", the task prompt is always estimated
      "token_counter": "o200k_base",             how prefix_tokens were made: fleetctl's exact
      "tokens_exact": true,                      counts (prefix-tokens.json), or
                                                 "bytes/4-estimate" and false
      "usage": {...} | null,                     as reported by the agent command, verbatim
      "usage_source": "agent-command" | null,
      "provider_usage": {"prompt_tokens": ..., ...} | null,   the provider's input tokens
                                                 summed (fleet_runner.usage)
      "duration_s": 12.3 | null,                 null for a turn cut short by a runner crash
      "outcome": "exited with status 0",
      "interrupted": false,                      true: written on restart for a cut-short turn
      "calls": {"reply": 2, "mcp-bridge": 1},    CLIs of the CLI index run in the turn, by name
      "tool_calls": {"tracker/create_issue": 1}  MCP tools called through mcp-bridge,
    }                                            "server/tool"

``calls`` and ``tool_calls`` are counted by shims first on the agent's PATH
(:mod:`fleet_runner.calls`): invocations, whatever their outcome (``--help`` included), of the
CLIs the agent finds by PATH lookup; ``{}`` when there were none. For a turn cut short by a
runner crash they hold the calls made before it. Lines written by older runners have neither key
(a reader must not take a missing key for "no calls").

``usage`` comes from the agent command's stdout: if its last non-empty line is a JSON object
with a ``"usage"`` object (``{"usage": {"input_tokens": ..., ...}}``, or a larger object
that contains one, as ``claude -p --output-format json`` prints), that object is recorded as is.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from fleet_runner.records import SCHEMA_VERSION, now_iso
from fleet_runner.tokens import TOKEN_COUNTER
from fleet_runner.usage import provider_usage

USAGE_SCAN_BYTES = 65_536
"""How much of the end of stdout is read to find the usage line, in bytes."""


def parse_usage(stdout_path: Path) -> dict[str, Any] | None:
    """The ``usage`` object from the last non-empty stdout line, or ``None``."""
    try:
        size = os.path.getsize(stdout_path)
        with open(stdout_path, "rb") as fh:
            fh.seek(max(0, size - USAGE_SCAN_BYTES))
            data = fh.read()
    except OSError:
        return None
    # Lines end at "\n" only: a JSON string may hold U+2028 raw, a line end to splitlines.
    lines = [ln for ln in data.decode("utf-8", "replace").split("\n") if ln.strip()]
    if not lines:
        return None
    try:
        obj = json.loads(lines[-1])
    except ValueError:
        return None
    usage = obj.get("usage") if isinstance(obj, dict) else None
    return usage if isinstance(usage, dict) else None


def ledger_record(*, agent: str, host: str | None, model: str | None, task: str, attempt: int,
                  run: str, prefix_tokens: dict[str, int], task_prompt_tokens: int,
                  usage: dict[str, Any] | None, duration_s: float | None, outcome: str,
                  interrupted: bool = False, calls: dict[str, int] | None = None,
                  tool_calls: dict[str, int] | None = None, token_counter: str = TOKEN_COUNTER,
                  tokens_exact: bool = False) -> dict[str, Any]:
    """One ledger line (fields in the module docstring).

    The runner always passes ``calls`` and ``tool_calls`` (:func:`fleet_runner.calls.count_calls`
    gives both; ``{}`` for none); ``None`` leaves the key out, as in a line an older runner
    wrote (tests and tools build such lines with this function).
    """
    line = {
        "schema_version": SCHEMA_VERSION, "time": now_iso(), "agent": agent, "host": host,
        "model": model, "task": task, "attempt": attempt, "run": run,
        "prefix_tokens": dict(prefix_tokens), "prefix_tokens_total": sum(prefix_tokens.values()),
        "task_prompt_tokens": task_prompt_tokens, "task_prompt_counter": TOKEN_COUNTER,
        "token_counter": token_counter, "tokens_exact": tokens_exact, "usage": usage,
        "usage_source": "agent-command" if usage is not None else None,
        "duration_s": round(duration_s, 3) if duration_s is not None else None,
        "outcome": outcome, "interrupted": interrupted,
    }
    # The provider's own count beside the runner's (fleet_runner.usage; issue 12).
    line["provider_usage"] = provider_usage(usage)
    if calls is not None:
        line["calls"] = dict(calls)
    if tool_calls is not None:
        line["tool_calls"] = dict(tool_calls)
    return line

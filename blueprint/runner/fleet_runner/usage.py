"""The provider's own token numbers for a turn, from what the agent command reported.

``claude -p --output-format json`` prints one JSON object last, whose ``usage`` holds what the
provider billed over every model call of the run: ``input_tokens`` (not cached),
``cache_creation_input_tokens`` (written to the prompt cache), ``cache_read_input_tokens``
(read from it) and ``output_tokens``. The ledger keeps that object verbatim (``usage``); this
module adds the one figure the audit is checked against (``provider_usage`` in the ledger)::

    {"prompt_tokens": 18250,            input + cache creation + cache read: every input token
     "input_tokens": 12, "cache_creation_input_tokens": 18000, "cache_read_input_tokens": 238,
     "output_tokens": 40,
     "source": "agent-command usage"}

``prompt_tokens`` is the provider's count of everything sent, summed over the run's model
calls; fleetctl's count (``fleetctl tokens --live``) is per call (prefix, harness profile, task
prompt), so for a run of one call the two should agree, and a run of several calls is at least
that many times the prefix. Standard library only (it runs on the hosts).
"""

from __future__ import annotations

from typing import Any

INPUT_KEYS = ("input_tokens", "cache_creation_input_tokens", "cache_read_input_tokens")


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 \
        else None


def provider_usage(usage: Any) -> dict[str, Any] | None:
    """The provider's figures from a ``usage`` object, or ``None`` when it has no integer
    ``input_tokens`` (not a provider's usage). Missing cache keys count as 0."""
    if not isinstance(usage, dict) or _int(usage.get("input_tokens")) is None:
        return None
    parts = {k: _int(usage.get(k)) or 0 for k in INPUT_KEYS}
    out: dict[str, Any] = {"prompt_tokens": sum(parts.values()), **parts,
                           "output_tokens": _int(usage.get("output_tokens")),
                           "source": "agent-command usage"}
    return out

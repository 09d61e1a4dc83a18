"""Counting tokens on the host: exact counts made by fleetctl, else a labelled estimate.

The runner is standard library only (hosts get no pip installs), and an exact BPE count needs the
encoding's ranks file and its pre-tokenizer, which the host does not have. But the prefix's text
components depend only on the release, so fleetctl counts them at render time with this runner's
own :mod:`fleet_runner.prefix` (docs/invariants.md, invariant 9) and the offline ``o200k_base``
encoder, and ships the counts as ``agents/<agent>/prefix-tokens.json`` with each component's sha256
(``fleetctl/tokencount/prefix_counts.py``). :func:`prefix_tokens` uses them when every component the
runner built has that digest: the ledger then says ``"token_counter": "o200k_base"``,
``"tokens_exact": true``. Otherwise, and always for the task prompt (it is made per task), the
number is an *estimate*: UTF-8 bytes divided by 4, rounded up, labelled :data:`TOKEN_COUNTER`
and ``"tokens_exact": false``, so a reader can always tell an estimate from a count.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

TOKEN_COUNTER = "bytes/4-estimate"
"""The name recorded beside every token number (``"token_counter"`` in the ledger)."""

TOKENS_EXACT = False
"""Whether :func:`count_tokens` is exact: it is not."""


def count_tokens(text: str) -> int:
    """Estimate the tokens of ``text``: ceil(UTF-8 bytes / 4). An estimate, not a count."""
    return (len(text.encode("utf-8", "surrogateescape")) + 3) // 4


EXACT_COUNTER = "o200k_base"
"""The counter named when fleetctl's render-time counts are used."""


def prefix_tokens(components: dict[str, str],
                  counts_file: Path) -> tuple[dict[str, int], str, bool]:
    """Tokens per prefix component: ``(tokens, counter name, exact)``.

    Exact (fleetctl's counts from ``counts_file``) only when that file names every component
    with the sha256 of the very text built here; otherwise estimates for all of them (a mix
    would make the total neither).
    """
    try:
        data = json.loads(counts_file.read_text("utf-8"))
        counted = data["components"]
        counter = str(data.get("counter") or EXACT_COUNTER)
    except (OSError, ValueError, KeyError, TypeError):
        counted = None
    if isinstance(counted, dict):
        exact = {}
        for name, text in components.items():
            entry = counted.get(name)
            digest = hashlib.sha256(text.encode("utf-8", "surrogateescape")).hexdigest()
            if not isinstance(entry, dict) or entry.get("sha256") != digest or \
                    not isinstance(entry.get("tokens"), int):
                break
            exact[name] = entry["tokens"]
        else:
            return exact, counter, True
    return {name: count_tokens(text) for name, text in components.items()}, TOKEN_COUNTER, False

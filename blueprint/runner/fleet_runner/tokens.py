"""Counting tokens on the host: a labelled estimate, never presented as a count.

The runner is standard library only (hosts get no pip installs), and an exact BPE count needs the
encoding's ranks file and its pre-tokenizer, which the host does not have. So every number this
module produces is an *estimate*: UTF-8 bytes divided by 4, rounded up. Every record that carries
one names the counter in :data:`TOKEN_COUNTER` and says ``"tokens_exact": false``, so a reader
can tell it from a count.

Exact counts of the same prefix come from ``fleetctl tokens``: it builds the prefix with this
runner's own :mod:`fleet_runner.prefix` (DESIGN.md invariant 9) and counts it with the offline
``o200k_base`` encoder, printing the encoder's provenance (docs/tokens.md). The ledger's
estimates are for trends between turns on one host; budgets are checked on the exact counts.
"""

from __future__ import annotations

TOKEN_COUNTER = "bytes/4-estimate"
"""The name recorded beside every token number (``"token_counter"`` in the ledger)."""

TOKENS_EXACT = False
"""Whether :func:`count_tokens` is exact: it is not."""


def count_tokens(text: str) -> int:
    """Estimate the tokens of ``text``: ceil(UTF-8 bytes / 4). An estimate, not a count."""
    return (len(text.encode("utf-8", "surrogateescape")) + 3) // 4

"""Counting tokens: a documented placeholder until issue 4 brings a real tokenizer.

Every number this module produces is an *estimate*: UTF-8 bytes divided by 4, rounded up. It is
never exact, and every record that carries one names the counter in ``TOKEN_COUNTER`` so a reader
(and ``fleetctl tokens``) can tell an estimate from a real count. Issue 4 replaces
:func:`count_tokens` and changes ``TOKEN_COUNTER`` with it.
"""

from __future__ import annotations

TOKEN_COUNTER = "bytes/4-estimate"
"""The name recorded beside every token number (``"token_counter"`` in the ledger)."""


def count_tokens(text: str) -> int:
    """Estimate the tokens of ``text``: ceil(UTF-8 bytes / 4). An estimate, not a count."""
    return (len(text.encode("utf-8", "surrogateescape")) + 3) // 4

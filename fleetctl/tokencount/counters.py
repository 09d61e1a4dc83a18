"""The token counters ``fleetctl tokens`` can use, each saying what kind of number it gives.

- :class:`O200kCounter`: exact ``o200k_base`` counts, offline (:mod:`fleetctl.tokencount.offline`).
  The default, and what budgets and baselines are checked on unless the Claude counter is chosen.
- :data:`CLAUDE_ESTIMATE`: a band for Claude's tokenizer derived from the ``o200k_base`` count.
  Always labelled an estimate, with its source; never used for a budget.
- :class:`ClaudeCountTokens`: Claude's own count from the Messages ``count_tokens`` endpoint,
  through any client object with ``client.messages.count_tokens(**request).input_tokens`` (the
  ``anthropic`` SDK's ``Anthropic()`` when an API key is configured; a scripted stand-in in tests).
  A prefix's parts are measured as *deltas* (the request with everything, minus the request
  without that part), so the fixed tool-use prompt, which the provider adds once when any tool
  is present, is counted once and never per tool. Results are cached by the SHA-256 of the
  canonical request, so an unchanged request is never sent twice.

A characters/4 figure is never presented as a count: there is no such counter here.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
from collections.abc import MutableMapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from fleetctl.errors import InputError
from fleetctl.tokencount.offline import Provenance, load_o200k

PROBE_MESSAGE = "."
"""The one user message every ``count_tokens`` request carries (the endpoint requires one)."""


class Counter(Protocol):
    """Counts the tokens of a text exactly, for one named encoding."""

    name: str

    def count(self, text: str) -> int:
        """The number of tokens of ``text``."""

    def provenance(self) -> dict[str, Any]:
        """Where the counts come from (printed in every report)."""


class O200kCounter:
    """Exact ``o200k_base`` counts with the offline, verified encoder.

    Raises (on construction):
        TokenizerError: the encoder or its data cannot be loaded or verified.
    """

    name = "o200k_base"

    def __init__(self) -> None:
        self._encoding, self._provenance = load_o200k()

    @property
    def source(self) -> Provenance:
        """The encoder's provenance."""
        return self._provenance

    def count(self, text: str) -> int:
        """Tokens of ``text``; special-token strings in it count as ordinary text."""
        return len(self._encoding.encode_ordinary(text)) if text else 0

    def provenance(self) -> dict[str, Any]:
        """Encoding, library, data file and its digest."""
        return self._provenance.to_json()


@dataclass(frozen=True, slots=True)
class EstimateBand:
    """An estimate of another tokenizer's count as a band of factors over an exact count.

    Attributes:
        name: what is estimated (``claude``).
        low_factor: the band's lower factor over the base count.
        high_factor: the band's upper factor.
        base: the exact counter the band is applied to.
        source: where the factors come from.
    """

    name: str
    low_factor: float
    high_factor: float
    base: str
    source: str

    def of(self, tokens: int) -> tuple[int, int]:
        """The band ``(low, high)`` for ``tokens`` of the base counter (floor, ceiling)."""
        return math.floor(tokens * self.low_factor), math.ceil(tokens * self.high_factor)

    def to_json(self) -> dict[str, Any]:
        """The band's definition as plain data."""
        return {"name": self.name, "estimate": True, "low_factor": self.low_factor,
                "high_factor": self.high_factor, "base": self.base, "source": self.source}


CLAUDE_ESTIMATE = EstimateBand(
    name="claude", low_factor=1.10, high_factor=1.40, base="o200k_base",
    source=("estimate, not a count: Claude's tokenizer is not published. Measured on the same "
            "inputs, Claude 3.5 Sonnet used about 16% more tokens than GPT-4o (o200k_base) on "
            "English prose and about 30% more on Python code (L. Gupta, \"Hidden costs in AI "
            "deployment\", VentureBeat, 2025); the band 1.10-1.40 widens that for JSON schemas. "
            "For Claude's own count use --counter claude-api."))


def request_digest(request: dict[str, Any]) -> str:
    """SHA-256 of a request's canonical JSON (sorted keys, compact): the cache key."""
    text = json.dumps(request, sort_keys=True, ensure_ascii=False, separators=(",", ":"))
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


class ClaudeCountTokens:
    """Claude's count of whole requests, from the ``count_tokens`` endpoint, cached by digest.

    Args:
        client: an object with ``client.messages.count_tokens(**request)`` returning something
            with an ``input_tokens`` integer (``anthropic.Anthropic()``).
        model: the model whose tokenizer counts.
        cache: digest → tokens, shared across counters; default a new in-memory dict.
    """

    name = "claude-count-tokens"

    def __init__(self, client: Any, model: str, cache: MutableMapping[str, int] | None = None
                 ) -> None:
        self._client = client
        self.model = model
        self.cache: MutableMapping[str, int] = {} if cache is None else cache
        self.requests_sent = 0

    def request(self, system: str, tools: list[dict[str, Any]]) -> dict[str, Any]:
        """The request counted for a system text and a tools array."""
        out: dict[str, Any] = {"model": self.model,
                               "messages": [{"role": "user", "content": PROBE_MESSAGE}]}
        if system:
            out["system"] = system
        if tools:
            out["tools"] = tools
        return out

    def count_request(self, system: str, tools: list[dict[str, Any]]) -> int:
        """Input tokens of the request with ``system`` and ``tools`` (cached by digest).

        Raises:
            InputError: the endpoint's answer carries no integer ``input_tokens``.
        """
        request = self.request(system, tools)
        key = request_digest(request)
        if key not in self.cache:
            try:
                answer = self._client.messages.count_tokens(**request)
            except Exception as exc:  # noqa: BLE001 - the provider's own words, reported
                raise CounterError(provider_message(exc)) from None
            self.requests_sent += 1
            tokens = getattr(answer, "input_tokens", None)
            if not isinstance(tokens, int) or isinstance(tokens, bool):
                raise CounterError(f"count_tokens answered without an integer input_tokens: "
                                   f"{answer!r}"[:300])
            if tokens <= 0:  # a request always has its probe message: never cached
                raise CounterError(f"count_tokens answered {tokens} for a request with a "
                                   "message: not a count")
            self.cache[key] = tokens
        return self.cache[key]

    def forget(self, system: str, tools: list[dict[str, Any]]) -> None:
        """Drop the cached answer for one request (an answer refused as a measurement)."""
        self.cache.pop(request_digest(self.request(system, tools)), None)

    def check_tools_counted(self, system: str, tools: list[dict[str, Any]]) -> int:
        """The tokens the ``tools`` add to a request with ``system``.

        Raises:
            CounterError: they add nothing (an endpoint, or a proxy before it, that drops tool
                definitions): refused as a measurement, and neither answer is kept in the cache.
        """
        added = self.count_request(system, tools) - self.count_request(system, [])
        if tools and added <= 0:
            self.forget(system, tools)
            self.forget(system, [])
            raise CounterError(f"count_tokens answered {added:+} tokens for {len(tools)} tool "
                               "definitions: the endpoint (or a proxy before it) drops them; "
                               "not a measurement (not cached)")
        return added

    def prefix_tokens(self, system: str, tools: list[dict[str, Any]]) -> int:
        """Tokens of a prefix: the request with it minus the bare request (probe message only)."""
        return self.count_request(system, tools) - self.count_request("", [])

    def provenance(self) -> dict[str, Any]:
        """The endpoint, the model and how the parts are measured."""
        return {"endpoint": "Messages count_tokens", "model": self.model,
                "method": "deltas: with minus without each part; cached by request sha256",
                "requests_sent": self.requests_sent}


class CounterError(InputError):
    """Claude's ``count_tokens`` failed or gave an answer that is not a measurement."""


def provider_message(exc: BaseException) -> str:
    """The provider's own message for a failed request (status and the error's ``message``),
    or the connection failure, in one line; never the API key (the SDK's errors hold none)."""
    status = getattr(exc, "status_code", None)
    body = getattr(exc, "body", None)
    message = None
    if isinstance(body, dict):
        error = body.get("error")
        message = error.get("message") if isinstance(error, dict) else None
    message = message or getattr(exc, "message", None) or str(exc) or type(exc).__name__
    head = f"count_tokens failed with HTTP {status}" if status else \
        f"count_tokens failed ({type(exc).__name__})"
    return f"{head}: {' '.join(str(message).split())}"[:500]


def anthropic_client(api_key_env: str = "ANTHROPIC_API_KEY") -> Any:
    """An ``anthropic.Anthropic`` client, when an API key is configured.

    The key is never read here: the SDK takes it from ``$ANTHROPIC_API_KEY`` itself.

    Raises:
        InputError: no key in the environment, or the ``anthropic`` package is not installed.
    """
    if not os.environ.get(api_key_env):
        raise InputError(f"--counter claude-api needs an API key in ${api_key_env}",
                         hint="or use the default offline counter (o200k_base)")
    try:
        import anthropic
    except ImportError:
        raise InputError("--counter claude-api needs the anthropic package",
                         hint="pip install 'fleetctl[claude]' (or anthropic)") from None
    return anthropic.Anthropic()


class JsonFileCache(dict):
    """A digest → tokens cache kept in a JSON file between runs (written by :meth:`save`)."""

    def __init__(self, path: Path) -> None:
        super().__init__()
        self.path = path
        try:
            data = json.loads(path.read_text("utf-8"))
        except (OSError, ValueError):
            data = {}
        if isinstance(data, dict):
            self.update({k: v for k, v in data.items() if isinstance(v, int)})

    def save(self) -> None:
        """Write the cache (best effort: a cache that cannot be written is only a cache)."""
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            tmp = self.path.with_suffix(".tmp")
            tmp.write_text(json.dumps(self, sort_keys=True), "utf-8")
            os.replace(tmp, self.path)
        except OSError:
            pass

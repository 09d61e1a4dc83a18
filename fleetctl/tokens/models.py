"""Per-model facts the report needs besides the prefix: the model's context window.

The tool-use system prompt's size lives with the prefix builder
(``fleet_runner.prefix.tool_use_prompt``), since it is part of what the model receives.

Source of the windows: Anthropic's models overview (docs.claude.com, "Models overview",
*Context window*): 200,000 tokens for Claude 4.x and 3.x models (Sonnet 4 and 4.5 can have
1,000,000 with a beta header, which an agent CLI does not send by default). A role that sets no
model runs the agent CLI's default, a Claude 4.x model. An unknown model is reported as such.
"""

from __future__ import annotations

from dataclasses import dataclass

MODELS_DOCS = "https://docs.claude.com/en/docs/about-claude/models/overview"

_WINDOWS: tuple[tuple[str, int], ...] = (
    ("claude-", 200_000),
    ("opus", 200_000),
    ("sonnet", 200_000),
    ("haiku", 200_000),
)


@dataclass(frozen=True, slots=True)
class ContextWindow:
    """A model's context window.

    Attributes:
        tokens: its size in tokens, or ``None`` when the model is unknown.
        model: the model asked about (``None``: the agent CLI's default).
        source: where the size comes from.
    """

    tokens: int | None
    model: str | None
    source: str


def context_window(model: str | None) -> ContextWindow:
    """The context window of ``model`` (``None``: the agent CLI's default Claude 4.x model)."""
    if model is None:
        return ContextWindow(200_000, None, f"{MODELS_DOCS} (default model, Claude 4.x assumed)")
    wanted = model.strip().lower()
    for prefix, tokens in _WINDOWS:
        if wanted.startswith(prefix):
            return ContextWindow(tokens, model, MODELS_DOCS)
    return ContextWindow(None, model, "unknown model: no context window on record")

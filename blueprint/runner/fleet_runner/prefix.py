"""The prompt prefix: what the model receives before the task on every turn (DESIGN.md §2).

One builder, used by the runner to make the prefix it sends and by ``fleetctl tokens`` to
measure the very same text (DESIGN.md invariant 9). It reads only its arguments and the skills
directory, holds no state, and importing it does nothing.

The prefix has three components, kept apart so each can be measured on its own:

``role_prompt``
    the role's system prompt, as written in the role file (trailing whitespace removed).
``skills_index``
    one line per skill: its name and the ``summary:`` from the front matter of its ``SKILL.md``.
``cli_index``
    one line per CLI in ``skills/<name>/bin/``: its name, its skill, and how to get its usage
    (``<cli> --help``). Usage itself is not in the prefix: it costs nothing until asked for.

The full text is the non-empty components joined by one blank line, in that order. The skills
directory has the same layout in the blueprint (``blueprint/skills``) and in a release
(``<release>/skills``), so both give the same prefix. A CLI is any regular file or symlink in
``bin/`` whose name does not start with ``.``, whatever its mode on disk (a checkout's mode bits
are not the shipped ones).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

COMPONENTS = ("role_prompt", "skills_index", "cli_index")
"""Component names, in the order they appear in the text."""

NO_SUMMARY = "(no summary in SKILL.md)"


class PrefixError(Exception):
    """A skill named by the config is missing from the skills directory."""


@dataclass(frozen=True)
class Prefix:
    """A built prompt prefix.

    Attributes:
        components: component name → its text, in ``COMPONENTS`` order (empty text if none).
        text: the full prefix as sent.
    """

    components: dict[str, str]
    text: str

    def tokens(self, counter: Callable[[str], int]) -> dict[str, int]:
        """Tokens per component with ``counter`` (text → tokens)."""
        return {name: counter(text) for name, text in self.components.items()}


def skill_summary(skill_md: Path) -> str:
    """The ``summary:`` value in the front matter of a ``SKILL.md``, or ``NO_SUMMARY``.

    Front matter is the block between a first line ``---`` and the next ``---``; the value may
    be quoted with ``"`` or ``'``.
    """
    try:
        lines = skill_md.read_text("utf-8").splitlines()
    except (OSError, UnicodeDecodeError):
        return NO_SUMMARY
    if not lines or lines[0].strip() != "---":
        return NO_SUMMARY
    for line in lines[1:]:
        if line.strip() == "---":
            break
        key, sep, value = line.partition(":")
        if sep and key.strip() == "summary":
            value = value.strip()
            if len(value) >= 2 and value[0] == value[-1] and value[0] in "\"'":
                value = value[1:-1]
            return value or NO_SUMMARY
    return NO_SUMMARY


def skill_clis(skill_dir: Path) -> list[str]:
    """Names of the CLIs in ``<skill_dir>/bin``, sorted."""
    bin_dir = skill_dir / "bin"
    try:
        names = os.listdir(bin_dir)
    except OSError:
        return []
    out = []
    for name in names:
        path = bin_dir / name
        if not name.startswith(".") and (path.is_symlink() or path.is_file()):
            out.append(name)
    return sorted(out)


def build_prefix(role_prompt: str, skills: Sequence[str], skills_dir: Path) -> Prefix:
    """Build the prompt prefix for a role.

    Args:
        role_prompt: the role's system prompt.
        skills: skill names in the role's order.
        skills_dir: the directory holding ``<name>/SKILL.md`` and ``<name>/bin/``.

    Raises:
        PrefixError: a skill has no directory under ``skills_dir``.
    """
    skills_dir = Path(skills_dir)
    missing = [s for s in skills if not (skills_dir / s).is_dir()]
    if missing:
        raise PrefixError(f"{skills_dir}: no skill directory for {', '.join(missing)}")
    skill_lines = [f"- {name}: {skill_summary(skills_dir / name / 'SKILL.md')}" for name in skills]
    cli_lines = [f"- {cli} (skill {name}): `{cli} --help`"
                 for name in skills for cli in skill_clis(skills_dir / name)]
    components = {
        "role_prompt": role_prompt.rstrip(),
        "skills_index": ("Skills you can use:\n" + "\n".join(skill_lines)) if skill_lines else "",
        "cli_index": ("CLIs on your PATH (run the command shown for usage before first use):\n"
                      + "\n".join(cli_lines)) if cli_lines else "",
    }
    text = "\n\n".join(t for t in components.values() if t)
    return Prefix(components=components, text=text)

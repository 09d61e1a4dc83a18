"""The scope of a run's writes: gitignore-style patterns naming what a run may change.

A role's ``writes`` (in ``agent.yaml``) is a list of patterns relative to the workspace. A
changed path is **in scope** when the last pattern that matches it is not negated; a path no
pattern matches is out of scope, so ``[]`` allows no change at all. The ``scope`` gate
(:func:`fleet_runner.gates.scope_gate`) fails on every added, modified or removed path out of
scope.

The subset of gitignore syntax implemented (standard library only, no git needed):

- one pattern per item; an empty item or one starting with ``#`` is ignored; trailing spaces
  are dropped (``\\ `` keeps one); ``\\`` makes the next character literal (``\\#``, ``\\!``);
- ``!`` at the start negates: a path a later ``!`` pattern matches is out of scope again;
- a ``/`` at the start or in the middle anchors the pattern to the workspace root
  (``/build``, ``docs/api``); without one the pattern matches at any depth (``*.md`` is
  ``**/*.md``);
- a ``/`` at the end matches directories only: everything below a directory of that name,
  never a file of that name;
- a pattern that matches a directory covers every path below it (``docs`` covers
  ``docs/a/b.md``);
- ``*`` is any run of characters but ``/``; ``?`` one character but ``/``; ``[abc]``,
  ``[a-z]``, ``[!a-z]`` one character of (or not of) a class, never ``/``;
- ``**/x`` is ``x`` at any depth, ``x/**`` everything inside ``x``, ``a/**/b`` zero or more
  directories between ``a`` and ``b``; any other ``**`` is ``*``.

**A git directory is never covered by a wildcard.** A path with a ``.git`` component
(``.git/config``, ``.git/hooks/pre-commit``, ``vendor/.git/HEAD``) is in scope only through a
pattern that has a ``.git`` component itself (``.git/hooks/``, ``vendor/*/.git/``,
``**/.git/**``): ``**``, ``*`` or a directory pattern such as ``vendor/`` never let a run change
what makes git run code or where it reads from. Negations apply to such paths as to any other.

Unlike git, a negation can carve a path out of a directory a pattern matched: git cannot
re-include a file whose parent directory is excluded (it never walks into it), whereas here
there is no directory walk and the last matching pattern always wins, so ``src/`` then
``!src/generated/`` reads as written. Matching is case-sensitive.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

GIT_COMPONENT = ".git"


class ScopeError(ValueError):
    """A pattern that cannot be compiled (the message quotes it)."""


@dataclass(frozen=True, slots=True)
class Rule:
    """One compiled pattern.

    Attributes:
        pattern: as written.
        negate: it started with ``!``.
        dir_only: it ended with ``/`` (matches directories only).
        regex: matches a whole workspace-relative path (``/``-separated).
        names_git: the pattern has a ``.git`` component (it may allow paths inside a git
            directory; module docstring).
    """

    pattern: str
    negate: bool
    dir_only: bool
    regex: re.Pattern[str]
    names_git: bool = False


@dataclass(frozen=True, slots=True)
class Scope:
    """Compiled ``writes`` patterns (see the module docstring)."""

    rules: tuple[Rule, ...]

    def allows(self, path: str) -> bool:
        """Whether the workspace-relative ``path`` (``a/b.txt``, a file) is in scope."""
        parts = path.strip("/").split("/")
        ancestors = ["/".join(parts[:i]) for i in range(1, len(parts))]
        in_git = GIT_COMPONENT in parts
        verdict = False
        for rule in self.rules:
            if in_git and not rule.negate and not rule.names_git:
                continue  # a wildcard never covers a git directory
            if any(rule.regex.fullmatch(a) for a in ancestors) or (
                    not rule.dir_only and rule.regex.fullmatch(path)):
                verdict = not rule.negate
        return verdict

    def outside(self, paths: Iterable[str]) -> list[str]:
        """The paths that are not in scope, in the order given."""
        return [p for p in paths if not self.allows(p)]


def compile_scope(patterns: Sequence[str]) -> Scope:
    """Compile ``writes`` patterns.

    Raises:
        ScopeError: a pattern with nothing to match (``!``, ``/``) or ending in a lone ``\\``.
    """
    rules = []
    for pattern in patterns:
        rule = _compile(pattern)
        if rule is not None:
            rules.append(rule)
    return Scope(tuple(rules))


def _compile(pattern: str) -> Rule | None:
    body = pattern.rstrip(" ")
    if body.endswith("\\") and len(body) < len(pattern):
        body += " "  # "\ " keeps one trailing space
    if not body or body.startswith("#"):
        return None
    negate = body.startswith("!")
    if negate:
        body = body[1:]
    dir_only = body.endswith("/") and not body.endswith("\\/")
    body = body.rstrip("/") if dir_only else body
    anchored = "/" in body
    body = body.lstrip("/")
    if not body:
        raise ScopeError(f"{pattern!r}: matches nothing (an empty pattern)")
    regex = _translate(body, pattern)
    if not anchored:
        regex = "(?:.*/)?" + regex
    names_git = GIT_COMPONENT in body.replace("\\", "").split("/")
    return Rule(pattern, negate, dir_only, re.compile(regex, re.DOTALL), names_git)


def _translate(body: str, pattern: str) -> str:
    """``body`` (no leading or trailing ``/``) as a regular expression over a whole path."""
    out: list[str] = []
    i, n = 0, len(body)
    if body.startswith("**/"):
        out.append("(?:.*/)?")
        i = 3
    while i < n:
        if body.startswith("/**/", i):
            out.append("/(?:.*/)?")
            i += 4
        elif body.startswith("/**", i) and i + 3 == n:
            out.append("/.*")
            i += 3
        elif body.startswith("**", i):
            out.append("[^/]*")
            i += 2
        elif body[i] == "*":
            out.append("[^/]*")
            i += 1
        elif body[i] == "?":
            out.append("[^/]")
            i += 1
        elif body[i] == "[":
            end = _class_end(body, i)
            if end < 0:
                out.append(re.escape("["))
                i += 1
                continue
            inner = body[i + 1:end]
            negated = inner[:1] in ("!", "^")
            inner = inner[1:] if negated else inner
            chars = "".join("\\" + c if c in "\\^[]" else c for c in inner)
            out.append(f"[^/{chars}]" if negated else f"(?!/)[{chars}]")
            i = end + 1
        elif body[i] == "\\":
            if i + 1 >= n:
                raise ScopeError(f"{pattern!r}: ends with a lone '\\'")
            out.append(re.escape(body[i + 1]))
            i += 2
        else:
            out.append(re.escape(body[i]))
            i += 1
    return "".join(out)


def _class_end(body: str, start: int) -> int:
    """The index of the ``]`` closing the class opened at ``start``, or -1."""
    j = start + 1
    if j < len(body) and body[j] in "!^":
        j += 1
    if j < len(body) and body[j] == "]":
        j += 1  # a "]" first in the class is a literal
    while j < len(body) and body[j] != "]":
        j += 1
    return j if j < len(body) else -1

"""The agent's result file (``$FLEET_RESULT``): its state, its summary and the files it claims.

An agent writes one UTF-8 JSON object per attempt to the path in ``$FLEET_RESULT``
(``STATE/agent/result-<enc task>-<n>.json``, :func:`result_path`)::

    {"state": "completed", "summary": "fixed the parser", "files": ["src/a.py", "old.txt"]}

- ``state``: one of :data:`RESULT_STATES` (A2A's terminal states and ``input-required``);
  optional.
- ``summary``: a string; optional.
- ``files``: every file the task added, modified or removed in the workspace, relative to
  it: the **claim**. Optional: absent, the result states no files (the role's ``claims:
  required`` then fails the run). ``[]`` claims that nothing changed.

No other key is allowed (a misspelt ``file`` would otherwise state nothing). A path is named as
the workspace snapshots name it (:mod:`fleet_runner.snapshot`): ``/``-separated, relative,
``.`` parts and doubled ``/`` dropped (``./src//a.py`` is ``src/a.py``); an absolute path, a
``..`` part, a ``/`` at the end (a directory), an empty path or a NUL is refused. A file
name that is not UTF-8 is written with JSON escapes ``\\udc80``-``\\udcff``, one per byte
that is not UTF-8, as Python's ``json.dumps(os.fsdecode(name))`` writes it (the snapshot's
names are ``os.fsdecode`` forms); any other lone surrogate names no file and is refused. No
Unicode normalisation: a file's name is its bytes (``café`` in NFC and in NFD are two
files); the gate's feedback points out a claim that differs from a change only so.

The file is read without following a symlink, only when it is a regular file with one link,
at most :data:`RESULT_MAX_BYTES`: the agent's directory is the agent's, and the runner that
reads it may see more than the agent may. An error never quotes the file's content.

:func:`read_result` reads it; :func:`fleet_runner.gates.claims_gate` judges the claim.
Standard library only; no side effects on import.
"""

from __future__ import annotations

import errno
import json
import os
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fleet_runner.names import encode_name

RESULT_STATES = ("completed", "failed", "input-required", "rejected")
"""The states an agent's result may state."""
CLAIMS_MODES = ("required", "checked", "off")
"""The role key ``claims``: the result must state its files, they are checked when stated
(the default), or never."""
DEFAULT_CLAIMS_MODE = "checked"
RESULT_MAX_BYTES = 1 << 20
"""A larger result file is refused."""
CLAIMS_MAX = 10_000
"""A result claiming more files is refused."""
RESULT_KEYS = ("state", "summary", "files")
RESULT_ENV = "FLEET_RESULT"
"""The environment variable that gives the agent its result file's path."""


class ClaimError(ValueError):
    """The result file cannot be used; the text names the file and what is wrong."""


@dataclass(frozen=True, slots=True)
class StatedResult:
    """What an agent's result file states.

    Attributes:
        state: one of :data:`RESULT_STATES`, or ``None`` (not stated).
        summary: the summary, or ``None``.
        files: the claimed paths, normalised (:func:`claim_path`), sorted, each once; ``None``
            when the result states no files.
    """

    state: str | None = None
    summary: str | None = None
    files: tuple[str, ...] | None = None

    def to_json(self) -> dict[str, Any]:
        """The record form."""
        return {"state": self.state, "summary": self.summary,
                "files": None if self.files is None else list(self.files)}


def result_path(agent_dir: Path, task: str, attempt: int) -> Path:
    """``$FLEET_RESULT`` of attempt ``attempt`` of ``task``: ``<agent_dir>/result-<enc
    task>-<n>.json`` (``agent_dir`` is ``STATE/agent``)."""
    return Path(agent_dir) / f"result-{encode_name(task)}-{attempt}.json"


def claim_path(text: str, workspace: str | os.PathLike[str] | None = None) -> str:
    """``text`` as the snapshots name a path (module docstring).

    Args:
        text: a claimed path.
        workspace: the workspace, to say how to write an absolute path inside it relatively.

    Raises:
        ClaimError: (the message is about the path only; the caller adds where it was)
            ``text`` is empty, absolute, has a ``..`` part, ends with ``/``, holds a NUL or a
            lone surrogate that stands for no byte, or names the workspace itself.
    """
    shown = json.dumps(text)
    if not text:
        raise ClaimError("an empty path")
    if "\0" in text:
        raise ClaimError(f"{shown}: a NUL is in no file name")
    try:
        data = text.encode("utf-8", "surrogateescape")
    except UnicodeEncodeError:
        raise ClaimError(f"{shown}: a lone surrogate that stands for no byte (a byte of a name "
                         "that is not UTF-8 is written \\udc80 to \\udcff)") from None
    # The snapshot's form of those bytes: \udcc3\udca9 is the UTF-8 of "é", named "é" there.
    text = data.decode("utf-8", "surrogateescape")
    if text.startswith("/"):
        hint = ""
        if workspace is not None:
            for base in {os.fspath(workspace), os.path.realpath(workspace)}:
                base = base.rstrip("/") + "/"
                if text.startswith(base) and text[len(base):].strip("/"):
                    hint = f": write it relative to the workspace, {json.dumps(text[len(base):])}"
                    break
            else:
                hint = ": it is not in the workspace, and only the workspace's files count"
        hint = hint or " (name it relative to the workspace)"
        raise ClaimError(f"{shown}: an absolute path{hint}")
    if text.endswith("/"):
        raise ClaimError(f"{shown}: ends with '/', a directory: name each file in it that "
                         "the task added, modified or removed")
    parts = [p for p in text.split("/") if p not in ("", ".")]
    if ".." in parts:
        raise ClaimError(f"{shown}: a '..' part: name each file by its path from the "
                         "workspace's top, without '..'")
    if not parts:
        raise ClaimError(f"{shown}: the workspace itself: name the files")
    return "/".join(parts)


def _read_bytes(path: Path) -> bytes | None:
    """The file's bytes; ``None`` when there is none. Never follows a symlink, never blocks
    on a FIFO."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        return None
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise ClaimError(f"{path}: a symlink, not the result file: write the file "
                             "itself") from None
        raise ClaimError(f"{path}: cannot read the result file: {exc.strerror}") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise ClaimError(f"{path}: not a regular file: write the result as a file")
        if st.st_nlink != 1:
            raise ClaimError(f"{path}: a file with {st.st_nlink} links (a hard link to "
                             "another file): write the result as a file of its own")
        if st.st_size > RESULT_MAX_BYTES:
            raise ClaimError(f"{path}: {st.st_size} bytes, more than the {RESULT_MAX_BYTES} "
                             "a result file may hold")
        chunks, size = [], 0
        while chunk := os.read(fd, 1 << 16):
            chunks.append(chunk)
            size += len(chunk)
            if size > RESULT_MAX_BYTES:
                raise ClaimError(f"{path}: more than the {RESULT_MAX_BYTES} bytes a result "
                                 "file may hold")
        return b"".join(chunks)
    except OSError as exc:
        raise ClaimError(f"{path}: cannot read the result file: {exc.strerror}") from None
    finally:
        os.close(fd)


def parse_result(data: bytes, where: str = "the result file",
                 workspace: str | os.PathLike[str] | None = None) -> StatedResult:
    """Validate a result file's bytes (module docstring).

    Args:
        data: the file's content.
        where: how the file is named in errors.
        workspace: the workspace (for the hint on an absolute path).

    Raises:
        ClaimError: not UTF-8, not JSON, not an object, an unknown key, a value of the wrong
            type, an unknown state, or a path :func:`claim_path` refuses (named by its index).
    """
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ClaimError(f"{where}: not UTF-8 (byte {exc.start}): write it as UTF-8 JSON; "
                         "a file name that is not UTF-8 goes in it as \\udcXX escapes") from None
    try:
        value = json.loads(text)
    except ValueError as exc:
        line, col = getattr(exc, "lineno", None), getattr(exc, "colno", None)
        at = f" at line {line} column {col}" if line is not None else ""
        reason = getattr(exc, "msg", "not JSON")
        raise ClaimError(f"{where}: not JSON{at} ({reason})") from None
    if not isinstance(value, dict):
        raise ClaimError(f"{where}: {_json_type(value)}, not an object: write "
                         '{"state": ..., "summary": ..., "files": [...]}')
    unknown = sorted(k for k in value if k not in RESULT_KEYS)
    if unknown:
        raise ClaimError(f"{where}: unknown key(s) {', '.join(map(json.dumps, unknown))} (the "
                         f"keys are {', '.join(RESULT_KEYS)})")
    state = value.get("state")
    if state is not None and state not in RESULT_STATES:
        raise ClaimError(f"{where}: state: {json.dumps(state)} is none of "
                         f"{', '.join(RESULT_STATES)}")
    summary = value.get("summary")
    if summary is not None and not isinstance(summary, str):
        raise ClaimError(f"{where}: summary: a string, not {_json_type(summary)}")
    if "files" not in value:
        return StatedResult(state, summary, None)
    files = value["files"]
    if not isinstance(files, list):
        raise ClaimError(f"{where}: files: a list of paths, not {_json_type(files)}")
    if len(files) > CLAIMS_MAX:
        raise ClaimError(f"{where}: files: {len(files)} paths, more than the {CLAIMS_MAX} a "
                         "result may claim")
    claimed = set()
    for i, item in enumerate(files):
        if not isinstance(item, str):
            raise ClaimError(f"{where}: files[{i}]: a path (a string), not {_json_type(item)}")
        try:
            claimed.add(claim_path(item, workspace))
        except ClaimError as exc:
            raise ClaimError(f"{where}: files[{i}]: {exc}") from None
    return StatedResult(state, summary, tuple(sorted(claimed)))


def _json_type(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    return {dict: "an object", list: "an array", str: "a string", int: "a number",
            float: "a number"}.get(type(value), type(value).__name__)


def read_result(path: Path, workspace: str | os.PathLike[str] | None = None
                ) -> StatedResult | None:
    """Read the result file at ``path``; ``None`` when the agent wrote none.

    Raises:
        ClaimError: the file is not a regular file of its own (a symlink, a FIFO, a hard
            link), is too large or cannot be read, or :func:`parse_result` refuses it.
    """
    data = _read_bytes(path)
    if data is None:
        return None
    return parse_result(data, f"{path}", workspace)

"""Writing records safely: whole JSON files by atomic rename, JSONL lines by one append.

A JSON file is written to a temporary name in the same directory, flushed to disk, and renamed
over the old one, so a reader (or a runner restarted after a crash) sees the old content or the
new, never half. A JSONL line is written with one ``write`` on an ``O_APPEND`` descriptor, so
lines from several writers (the runner, the CLIs) do not interleave.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

SCHEMA_VERSION = 1


def now_iso(t: float | None = None) -> str:
    """UTC time as ``2026-11-30T01:38:57.332Z`` (milliseconds)."""
    t = time.time() if t is None else t
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(t)) + f".{int(t * 1000) % 1000:03d}Z"


def write_json_atomic(path: Path, data: Any) -> None:
    """Write ``data`` as JSON to ``path`` by temporary file, fsync and rename.

    UTF-8 text as it is; a string that cannot be UTF-8 (a file or root name that is not valid
    UTF-8 arrives as lone surrogates) makes the whole file ASCII with ``\\u`` escapes, which
    every JSON reader takes back. Before, such a name raised in the middle of a record and the
    runner died on every start while the task held it.
    """
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    text = json.dumps(data, indent=1, sort_keys=True, ensure_ascii=False) + "\n"
    try:
        body = text.encode("utf-8")
    except UnicodeEncodeError:
        body = (json.dumps(data, indent=1, sort_keys=True) + "\n").encode("ascii")
    with open(tmp, "wb") as fh:
        fh.write(body)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)


def read_json(path: Path) -> Any:
    """Read a JSON file; ``None`` if it does not exist.

    Raises:
        ValueError: the file is not valid JSON.
    """
    try:
        with open(path, encoding="utf-8") as fh:
            return json.load(fh)
    except FileNotFoundError:
        return None


def append_jsonl(path: Path, record: dict[str, Any]) -> None:
    """Append one JSON line to ``path`` with a single ``O_APPEND`` write, then fsync; after a
    newline when the file ends in a line cut short.

    The line is ASCII (``\\uXXXX`` escapes): a name from outside may hold U+2028 or U+0085,
    which ``str.splitlines`` takes for line ends, so another reader would cut the record."""
    line = (json.dumps(record, sort_keys=True) + "\n").encode("ascii")
    fd = os.open(path, os.O_RDWR | os.O_APPEND | os.O_CREAT, 0o600)
    try:
        # After a line cut short (a writer killed mid-write, a full disk), a newline first:
        # glued to it, this record would be one broken line that every reader skips.
        end = os.fstat(fd).st_size
        if end and os.pread(fd, 1, end - 1) != b"\n":
            line = b"\n" + line
        os.write(fd, line)
        os.fsync(fd)
    finally:
        os.close(fd)


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    """Every JSON object line of ``path`` (missing file: none; broken lines are skipped)."""
    out = []
    try:
        with open(path, encoding="utf-8", errors="replace") as fh:
            for line in fh:
                try:
                    value = json.loads(line)
                except ValueError:
                    continue
                if isinstance(value, dict):
                    out.append(value)
    except FileNotFoundError:
        pass
    return out


def tail_text(path: Path, max_bytes: int) -> str:
    """The last ``max_bytes`` bytes of a file as text (``""`` if missing), marked if cut."""
    try:
        size = os.path.getsize(path)
        with open(path, "rb") as fh:
            if size > max_bytes:
                fh.seek(size - max_bytes)
            data = fh.read(max_bytes)
    except OSError:
        return ""
    text = data.decode("utf-8", "replace")
    if size > max_bytes:
        return f"[... first {size - max_bytes} of {size} bytes cut ...]\n" + text
    return text


def head_text(text: str, max_bytes: int) -> str:
    """``text`` cut to at most about ``max_bytes`` UTF-8 bytes, marked if cut."""
    data = text.encode("utf-8", "replace")
    if len(data) <= max_bytes:
        return text
    return data[:max_bytes].decode("utf-8", "ignore") + (
        f"\n[... {len(data) - max_bytes} more bytes cut ...]")

"""The inbox: a spool directory of messages, one JSON file each, moved as work proceeds.

A message file (UTF-8 JSON object)::

    {
      "id": "slack:C042:1732950000.1234",          required; the task id
      "from": {"kind": "human", "name": "alice"},  required; kind is "human" or "agent"
      "channel": "#support",                       required when kind is "human": where to reply
      "text": "What is the refund policy?",        required; the request
      "reply_to": "slack:C042:1732949000.0001",    optional; the message this one answers
      "thread": "slack:C042:1732940000.0001"       optional; the thread (A2A contextId) it is
    }                                                  in: the id rule; default its own id

A file whose ``kind`` is ``"task"`` is a hand-off or a result (:mod:`fleet_runner.handoff`,
an A2A Task) that :func:`fleet_runner.teamstate.receive` dropped: it is parsed by those rules
and becomes a message from an agent (the producer), with the brief (or the result's summary)
as its text, the thread's channel as its channel, and the parsed file in ``team``.

Other keys are kept and ignored. An id is 1 to 128 characters of letters, digits and
``._:@+-``, starting with a letter or digit, checked on the whole value; it names files only
in its encoded form (:func:`fleet_runner.names.encode_name`: ``:`` would split the agent's
``PATH``). No string may hold a lone surrogate, and no name (id, ``from.name``, channel,
``reply_to``) a NUL: neither can be carried where the runner puts it.

Dropping a message (a chat bridge, ``fleetctl`` or an operator): write it to a name starting
with ``.`` in the inbox, then rename it to a name ending in ``.json``. The runner skips dot-files
and anything not ending in ``.json``, so it never reads a half-written message. Messages are
taken oldest first (modification time, then name).

Moves, each an atomic rename within the state directory:
``inbox/ → processing/`` before any work; ``processing/ → done/`` when the task passed
verification; ``processing/ → failed/`` when it gave up, was denied, was invalid (including a
directory, symlink or other non-regular file named ``*.json``), or repeats an id already
finished. A message that cannot be read or moved now (an ``OSError``: permissions, I/O; for
example a directory named ``*.json`` that the agent's user may not move) is not moved: it stays
in the inbox and is tried again at the next scan. A name already present in the
destination gets a ``.<n>`` before ``.json``.
"""

from __future__ import annotations

import json
import os
import re
import stat
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

HUMAN = "human"
AGENT = "agent"
_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:@+-]{0,127}")
"""The whole id (``fullmatch``: with ``re.match`` a ``$`` also matched before a trailing newline,
so ``"t1\\n"`` passed and split the runner's log)."""
_NAME_FIELDS = ("id", "from.name", "channel", "reply_to")


def _uncarried(value: str, name: bool) -> str | None:
    """Why ``value`` cannot be carried where the runner puts it, or ``None``: a lone surrogate
    (a ``\\udXXX`` escape that is not half of a pair) is no character and cannot be written as
    UTF-8 (the prompt, the records, the reply); a NUL ends a C string, so no environment
    variable or argument (``FLEET_CHANNEL``, ``reply --channel``) can hold a name with one."""
    if any(0xD800 <= ord(ch) <= 0xDFFF for ch in value):
        return "holds a lone surrogate (\\udXXX), which is not a character"
    if name and "\0" in value:
        return "holds a NUL character, which no argument or environment variable can carry"
    return None


class MessageError(Exception):
    """A message file is not a valid message (the text says what is wrong)."""


@dataclass(frozen=True, slots=True)
class Message:
    """One inbox message.

    Attributes:
        id: the task id.
        sender_kind: ``"human"`` or ``"agent"``.
        sender_name: who sent it.
        channel: where a reply goes (``None`` allowed for agent messages).
        text: the request.
        reply_to: the id of the message this answers, or ``None``.
        raw: the whole JSON object as received.
        thread: the thread it is in (an A2A ``contextId``; hand-offs of the team carry it):
            its ``thread`` key, by default (and when built without one) its own id.
        team: the parsed hand-off or result (:mod:`fleet_runner.handoff`), or ``None`` for a
            plain message.
    """

    id: str
    sender_kind: str
    sender_name: str
    channel: str | None
    text: str
    reply_to: str | None = None
    raw: dict[str, Any] = field(default_factory=dict)
    thread: str = ""
    team: Any = None

    def __post_init__(self) -> None:
        if not self.thread:
            object.__setattr__(self, "thread", self.id)

    @property
    def human(self) -> bool:
        """Whether a person sent it (anti-silence applies)."""
        return self.sender_kind == HUMAN


def parse_message(data: bytes) -> Message:
    """Parse and validate a message file's bytes.

    Raises:
        MessageError: not UTF-8 JSON, not an object, or a field missing or of the wrong type.
    """
    try:
        obj = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as exc:
        raise MessageError(f"not UTF-8 JSON: {exc}") from None
    if not isinstance(obj, dict):
        raise MessageError("not a JSON object")
    if obj.get("kind") == "task":
        return _team_message(data, obj)
    mid = obj.get("id")
    if not isinstance(mid, str) or not _ID.fullmatch(mid):
        raise MessageError("id: required, 1-128 of letters, digits and ._:@+- "
                           "(starting with a letter or digit)")
    sender = obj.get("from")
    if not isinstance(sender, dict):
        raise MessageError('from: required, {"kind": "human"|"agent", "name": ...}')
    kind = sender.get("kind")
    if kind is None:
        raise MessageError('from.kind: required, "human" or "agent"')
    if kind not in (HUMAN, AGENT):
        raise MessageError(f'from.kind: {json.dumps(kind)[:60]} is not one of the allowed kinds, '
                           '"human" or "agent"')
    name = sender.get("name")
    if not isinstance(name, str) or not name:
        raise MessageError("from.name: required, a non-empty string")
    channel = obj.get("channel")
    if channel is not None and not isinstance(channel, str):
        raise MessageError("channel: must be a string")
    if sender["kind"] == HUMAN and not channel:
        raise MessageError("channel: required for a message from a human (where to reply)")
    text = obj.get("text")
    if not isinstance(text, str):
        raise MessageError("text: required, a string")
    reply_to = obj.get("reply_to")
    if reply_to is not None and not isinstance(reply_to, str):
        raise MessageError("reply_to: must be a string or null")
    thread = obj.get("thread")
    if thread is not None and (not isinstance(thread, str) or not _ID.fullmatch(thread)):
        raise MessageError("thread: must be null or an id: 1-128 of letters, digits and "
                           "._:@+- (starting with a letter or digit)")
    for key, value in (("id", mid), ("from.name", name), ("channel", channel),
                       ("reply_to", reply_to), ("text", text)):
        why = _uncarried(value, key in _NAME_FIELDS) if isinstance(value, str) else None
        if why:
            raise MessageError(f"{key}: {why}")
    return Message(id=mid, sender_kind=sender["kind"], sender_name=name, channel=channel or None,
                   text=text, reply_to=reply_to, raw=obj, thread=thread or mid)


def _team_message(data: bytes, obj: dict[str, Any]) -> Message:
    """A hand-off or result file as a message from its producer."""
    from fleet_runner import handoff  # handoff imports this module (the id rule)

    try:
        parsed = handoff.parse_team_file(data)
    except handoff.HandoffError as exc:
        raise MessageError(f"a hand-off or result refused ({exc.code}): {exc.text}") from None
    if isinstance(parsed, handoff.Handoff):
        return Message(id=parsed.id, sender_kind=AGENT, sender_name=parsed.producer.agent,
                       channel=parsed.channel, text=parsed.brief, raw=obj, team=parsed,
                       thread=parsed.thread)
    return Message(id=parsed.id, sender_kind=AGENT, sender_name=parsed.producer.agent,
                   channel=parsed.channel, text=parsed.summary, reply_to=parsed.id, raw=obj,
                   team=parsed, thread=parsed.thread)


def read_message_file(path: Path) -> bytes:
    """The bytes of a message file, without following a symlink.

    Raises:
        MessageError: the ``*.json`` entry is not a regular file (a directory, a symlink, a FIFO
            ...): it is not a message, whatever it points to.
        OSError: the file cannot be read now (permissions, I/O): it may be readable later.
    """
    st = os.lstat(path)
    if not stat.S_ISREG(st.st_mode):
        kind = ("a directory" if stat.S_ISDIR(st.st_mode) else
                "a symlink" if stat.S_ISLNK(st.st_mode) else "not a regular file")
        raise MessageError(f"{kind}, not a message file")
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):  # replaced between lstat and open
            raise MessageError("not a regular file, not a message file")
        chunks: list[bytes] = []
        while True:
            chunk = os.read(fd, 1 << 16)
            if not chunk:
                return b"".join(chunks)
            chunks.append(chunk)
    finally:
        os.close(fd)


def _is_message_name(name: str) -> bool:
    return name.endswith(".json") and not name.startswith(".")


class Spool:
    """The inbox and the directories messages move through (``AgentPaths`` layout)."""

    def __init__(self, inbox: Path, processing: Path, done: Path, failed: Path) -> None:
        self.inbox, self.processing = Path(inbox), Path(processing)
        self.done, self.failed = Path(done), Path(failed)

    def _listed(self, directory: Path) -> list[Path]:
        entries = []
        try:
            with os.scandir(directory) as it:
                for entry in it:
                    # Every kind of entry: a directory or symlink named *.json is listed too,
                    # so that it is set aside as invalid rather than ignored for ever.
                    if _is_message_name(entry.name):
                        try:
                            entries.append((entry.stat(follow_symlinks=False).st_mtime_ns,
                                            entry.name))
                        except FileNotFoundError:
                            continue
        except FileNotFoundError:
            return []
        return [directory / name for _, name in sorted(entries)]

    def pending(self) -> list[Path]:
        """Inbox messages, oldest first."""
        return self._listed(self.inbox)

    def in_processing(self) -> list[Path]:
        """Messages claimed but not finished (left by a stopped runner), oldest first."""
        return self._listed(self.processing)

    def claim(self, path: Path) -> Path | None:
        """Move an inbox message into ``processing/``; ``None`` if it is gone already.

        Raises:
            OSError: it cannot be moved now (for example ``EACCES``: a directory owned by another
                user, whose ``..`` entry a rename must update); it is left where it is.
        """
        dest = self.processing / path.name
        if os.path.lexists(dest):
            dest = _free_name(self.processing, path.name)
        try:
            os.rename(path, dest)
        except FileNotFoundError:
            return None
        _sync_dir(self.processing)
        return dest

    def unclaim(self, path: Path) -> Path:
        """Move a processing message back into the inbox (it could not be read); return where."""
        dest = _free_name(self.inbox, path.name)
        os.rename(path, dest)
        _sync_dir(self.inbox)
        return dest

    def finish(self, path: Path, ok: bool) -> Path:
        """Move a processing message to ``done/`` (``ok``) or ``failed/``; return where."""
        directory = self.done if ok else self.failed
        dest = _free_name(directory, path.name)
        os.rename(path, dest)
        _sync_dir(directory)
        return dest


def _free_name(directory: Path, name: str) -> Path:
    dest = directory / name
    stem = name[:-5] if name.endswith(".json") else name
    n = 1
    while os.path.lexists(dest):
        dest = directory / f"{stem}.{n}.json"
        n += 1
    return dest


def _sync_dir(directory: Path) -> None:
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)

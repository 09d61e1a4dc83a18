"""The team's small state machine: a person in command of a thread, and the hop budget.

Decisions are pure functions over data (:func:`plan_scan`, :func:`plan_clear`,
:func:`hop_check`, the texts), tested on case files like fleetctl's ``plan_ship``; the file
effects that carry them out are apart (:class:`TeamFiles`, :func:`post_line`).

**A person in command.** A *thread* is an A2A ``contextId``: a hand-off's or result's
``contextId``, a chat message's ``thread`` (its own id by default). A thread *agents are working
in* is one this runner has hand-offs or results of in flight (``team/sent/`` records still
``pending`` or ``delivered``), in its inbox or ``processing/``, or paused. When a person's message
(``from.kind`` human) arrives in such a thread, the runner, before anything else runs:

1. writes the flag ``STATE/team/command/<enc thread>.json``
   (``{thread, set, by_message, person, channel}``) and a ``set`` line in
   ``STATE/team/command.jsonl``;
2. moves every agent item of that thread (hand-offs, results, agents' messages), in inbox order,
   to ``STATE/team/paused/<enc thread>/<seq>-<inbox name>``: the bytes unchanged, ``seq``
   (``000001``...) their order; every later one that arrives while the flag stands follows;
3. takes the person's message as the next run's input;
4. logs, and posts to the thread's channel, one line: a person is in command.

An agent cannot clear the flag. With two users ``STATE/team/`` is the runner's (0700): the agent's
user cannot delete the flag (``EACCES``). A flag deleted anyway (one user) is set again from the
journal and the deletion recorded in ``STATE/team/refused.jsonl``. An agent's hand-off or
result that asks to resume is paused like any other, and its attempt recorded there too.

The person's action clears it: ``fleet-runner --agent A --root R --clear-command THREAD``. The
flag is marked ``clearing`` first, then the paused files go back to the inbox in their order,
with the modification times they arrived with (strictly increasing: ahead of anything of the
thread that came after them), then the flag goes: a clear a crash cut short is finished by the
next scan, before anything else, and never reorders. Other threads carry on throughout.

**The hop budget.** A hand-off carries ``hops`` (the first hand-off of a root task is hop 1) and
``hop_budget``; every runner it passes checks :func:`hop_check` at its boundary (the budget is the
smaller of the carried one and the receiving agent's own ``hop_budget``: a forged higher budget
buys nothing). The hop past the budget is refused with code ``hop-budget``; the sender's task
ends escalated with one message naming the task, the agents and the count, sent once per root
task (:meth:`TeamFiles.hop_escalation_due`, across retries and restarts).

Standard library only; no side effects on import.
"""

from __future__ import annotations

import fcntl
import json
import os
import re
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fleet_runner.inbox import MessageError, parse_message, read_message_file
from fleet_runner.names import decode_name, encode_name, one_line

DEFAULT_HOP_BUDGET = 6
"""Hops a root task may take when the agent config sets none."""
HOP_BUDGET = "hop-budget"
"""The refusal code of a hand-off past its hop budget."""
PAUSED = "paused"
"""The (informational) code of a hand-off kept paused: not a refusal."""
IN_FLIGHT_STATES = ("pending", "delivered")
"""``team/sent/`` states of a hand-off still in flight (no result yet)."""
_RESUME = re.compile(r"\b(resume|resuming|un-?pause|clear[- ]command|clear the (flag|command)"
                     r"|release the (flag|command))\b", re.IGNORECASE)
_SEQ = re.compile(r"(\d{6,})-(.+\.json)")
POST_TIMEOUT_S = 30.0


# -- data --------------------------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class Item:
    """One inbox (or ``processing/``) entry as the state machine sees it.

    Attributes:
        name: its file name.
        thread: its thread, or ``None`` (not readable as a message or team file: never paused,
            the loop sets it aside as it does today).
        person: a person's chat message.
        id: its id (task id), or ``None``.
        kind: ``"message"``, ``"handoff"`` or ``"result"``.
        sender: who sent it (the person's or the producing agent's name).
        channel: the person's channel (a message's ``channel``, a team file's).
        text: the message text, the brief or the summary.
    """

    name: str
    thread: str | None
    person: bool = False
    id: str | None = None
    kind: str = "message"
    sender: str = ""
    channel: str | None = None
    text: str = ""


@dataclass(frozen=True, slots=True)
class Flag:
    """The person-in-command flag of one thread (``team/command/<enc thread>.json``)."""

    thread: str
    set: float
    by_message: str | None
    person: str | None
    channel: str | None
    clearing: bool = False

    def to_json(self) -> dict[str, Any]:
        """The flag file's object."""
        out: dict[str, Any] = {"thread": self.thread, "set": self.set,
                               "by_message": self.by_message, "person": self.person,
                               "channel": self.channel}
        if self.clearing:
            out["clearing"] = True
        return out

    @classmethod
    def from_json(cls, obj: Mapping[str, Any]) -> Flag:
        """A flag from its file's object.

        Raises:
            ValueError: not a flag object.
        """
        thread = obj.get("thread")
        if not isinstance(thread, str) or not thread:
            raise ValueError("thread: required, a non-empty string")
        when = obj.get("set")
        if isinstance(when, bool) or not isinstance(when, (int, float)):
            raise ValueError("set: required, a time (seconds since the epoch)")

        def text(key: str) -> str | None:
            value = obj.get(key)
            return value if isinstance(value, str) else None

        return cls(thread=thread, set=float(when), by_message=text("by_message"),
                   person=text("person"), channel=text("channel"),
                   clearing=obj.get("clearing") is True)


@dataclass(frozen=True, slots=True)
class TeamView:
    """What the runner knows of its threads before a scan.

    Attributes:
        flags: the flag files, by thread.
        paused: the paused file names of each thread, in their order.
        in_flight: threads with a hand-off of this agent's in flight (``team/sent/``).
        journal: threads whose last ``command.jsonl`` line is ``set`` (the flag should exist),
            with that line's flag.
    """

    flags: Mapping[str, Flag] = field(default_factory=dict)
    paused: Mapping[str, Sequence[str]] = field(default_factory=dict)
    in_flight: frozenset[str] = frozenset()
    journal: Mapping[str, Flag] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class ScanPlan:
    """What a scan decided, in the order it is carried out.

    Attributes:
        finish_clears: threads whose clear a crash cut short: finished first.
        set_flags: flags to write (new, or set again after a deletion), before anything else.
        pause: ``(inbox name, thread)`` to move to the thread's paused files, in inbox order.
        refused: records for ``refused.jsonl`` (an agent asking to resume, a deleted flag).
        announce: the flags newly set: one "a person is in command" line each.
        first: the person messages of commanded threads, in inbox order: the next runs' inputs.
    """

    finish_clears: tuple[str, ...] = ()
    set_flags: tuple[Flag, ...] = ()
    pause: tuple[tuple[str, str], ...] = ()
    refused: tuple[dict[str, Any], ...] = ()
    announce: tuple[Flag, ...] = ()
    first: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class ClearPlan:
    """How a clear puts a thread's paused files back: ``moves`` are ``(paused name, inbox
    name, mtime_ns)`` in their order, mtimes increasing."""

    thread: str
    moves: tuple[tuple[str, str, int], ...]


@dataclass(frozen=True, slots=True)
class HopVerdict:
    """:func:`hop_check`'s answer: ``ok``, else ``code`` (``hop-budget``) and ``reason``."""

    ok: bool
    hops: int
    budget: int
    code: str | None = None
    reason: str | None = None


# -- pure decisions ----------------------------------------------------------------------------

def asks_to_resume(text: str) -> bool:
    """Whether an agent's text asks to resume a paused thread or clear the flag."""
    return bool(_RESUME.search(text))


def working_threads(view: TeamView, items: Iterable[Item]) -> set[str]:
    """The threads agents are working in: in flight, paused, commanded, or with an agent's item
    in ``items`` (the inbox or ``processing/``)."""
    threads = set(view.in_flight) | set(view.flags) | {t for t, p in view.paused.items() if p}
    threads |= {i.thread for i in items if i.thread is not None and not i.person}
    return threads


def plan_scan(view: TeamView, items: Sequence[Item], now: float) -> ScanPlan:
    """Decide a scan of the inbox (``items`` in inbox order, oldest first, ``processing/``
    first if any).

    A flag that is ``clearing`` is finished first (its thread is not commanded any more). A
    thread whose journal says commanded but whose flag file is gone gets its flag back (and a
    ``flag-deleted`` record). A person's message in a thread agents are working in sets the
    thread's flag (once: the first such message names it). Then every agent item of a
    commanded thread is paused, in order; one asking to resume is recorded as refused too.
    """
    finish = tuple(sorted(t for t, f in view.flags.items() if f.clearing))
    flags = {t: f for t, f in view.flags.items() if not f.clearing}
    set_flags: list[Flag] = []
    refused: list[dict[str, Any]] = []
    for thread, flag in sorted(view.journal.items()):
        if thread not in view.flags:
            flags[thread] = flag
            set_flags.append(flag)
            refused.append({"time": now, "what": "flag-deleted", "thread": thread,
                            "reason": "the person-in-command flag file was deleted while the "
                                      "person was in command; set again (only "
                                      "--clear-command clears it)"})
    view_now = TeamView(flags=flags, paused=view.paused, in_flight=view.in_flight)
    # Worked in when the person's message came: an agent item older than it counts, a later
    # one does not (the person did not speak into it).
    working = working_threads(view_now, ()) - set(finish)
    announce: list[Flag] = []
    first: list[str] = []
    for item in items:
        if not item.person and item.thread is not None and item.thread not in finish:
            working.add(item.thread)
        if item.person and item.thread is not None and item.thread in working:
            if item.thread not in flags:
                flag = Flag(thread=item.thread, set=now, by_message=item.id,
                            person=item.sender or None, channel=item.channel)
                flags[item.thread] = flag
                set_flags.append(flag)
                announce.append(flag)
            first.append(item.name)
    pause: list[tuple[str, str]] = []
    for item in items:
        if item.person or item.thread is None or item.thread not in flags:
            continue
        pause.append((item.name, item.thread))
        if asks_to_resume(item.text):
            refused.append({"time": now, "what": "resume-request", "thread": item.thread,
                            "id": item.id, "kind": item.kind, "from": item.sender,
                            "reason": "an agent asked to resume a thread a person is in "
                                      "command of: kept paused (only the person's "
                                      "--clear-command resumes it)"})
    return ScanPlan(finish_clears=finish, set_flags=tuple(set_flags), pause=tuple(pause),
                    refused=tuple(refused), announce=tuple(announce), first=tuple(first))


def next_seq(names: Iterable[str]) -> int:
    """The sequence number the next paused file of a thread gets (1 for none)."""
    seqs = [int(m.group(1)) for m in map(_SEQ.fullmatch, names) if m]
    return max(seqs, default=0) + 1


def paused_name(seq: int, inbox_name: str) -> str:
    """``<seq 000001>-<inbox name>``."""
    return f"{seq:06d}-{inbox_name}"


def paused_order(names: Iterable[str]) -> list[str]:
    """Paused file names in their order (by sequence number; other names left out)."""
    found = [(int(m.group(1)), m.group(0)) for m in map(_SEQ.fullmatch, names) if m]
    return [name for _, name in sorted(found)]


def plan_clear(thread: str, paused: Sequence[tuple[str, int]]) -> ClearPlan:
    """Put ``thread``'s paused files (``(name, mtime_ns)``) back into the inbox in their order:
    each under the inbox name it had, with the modification time it arrived with (pausing is a
    rename: it keeps it), made strictly increasing along the order. So they come back ahead of
    anything of the thread that arrived after them, whenever that was, and a clear done twice
    (a crash between) plans the same times."""
    moves = []
    last = None
    order = {name: mtime for name, mtime in paused}
    for name in paused_order(order):
        m = _SEQ.fullmatch(name)
        assert m is not None  # paused_order keeps only these
        mtime = order[name] if last is None else max(order[name], last + 1)
        moves.append((name, m.group(2), mtime))
        last = mtime
    return ClearPlan(thread=thread, moves=tuple(moves))


def command_line(flag: Flag) -> str:
    """The one line that says a person is in command of a thread."""
    who = flag.person or "a person"
    return (f"{who} is in command of thread {flag.thread} (message {flag.by_message}): the "
            "agents' hand-offs and results in it are paused until the person clears it")


def hop_check(hops: int, hop_budget: int, local_budget: int | None = None, *,
              root_task: str = "", producer: str = "", consumer: str = "") -> HopVerdict:
    """Whether a hand-off at hop ``hops`` may pass this boundary.

    The budget is the smaller of the carried ``hop_budget`` and this runner's agent's own
    (``local_budget``): a hand-off cannot raise it on the way. Hop ``budget + 1`` and later are
    refused (code ``hop-budget``); the reason names the root task, the agents and the count.
    """
    budget = hop_budget if local_budget is None else min(hop_budget, local_budget)
    if hops <= budget:
        return HopVerdict(ok=True, hops=hops, budget=budget)
    return HopVerdict(ok=False, hops=hops, budget=budget, code=HOP_BUDGET,
                      reason=hop_text(root_task=root_task, producer=producer,
                                      consumer=consumer, hops=hops, budget=budget))


def may_dispatch(task_hops: int, task_budget: int) -> bool:
    """Whether a task at hop ``task_hops`` (0: a person's message) may hand off once more."""
    return task_hops + 1 <= task_budget


def outgoing_hops_refusal(task_hops: int, task_budget: int, handoff_hops: int,
                          handoff_budget: int) -> str | None:
    """Why a hand-off the agent wrote does not carry its task's hops, or ``None``: it must be
    hop ``task_hops + 1`` with the task's budget (the agent writes the file; the runner knows
    the count)."""
    if handoff_hops != task_hops + 1:
        return (f"metadata.fleet.hops: {handoff_hops}, but this task is hop {task_hops}, so a "
                f"hand-off from it is hop {task_hops + 1}")
    if handoff_budget != task_budget:
        return (f"metadata.fleet.hop_budget: {handoff_budget}, but this task's root task has "
                f"a budget of {task_budget}")
    return None


def hop_text(*, root_task: str, producer: str, consumer: str, hops: int, budget: int,
             task: str | None = None) -> str:
    """The one message to the person: the task, the agents and the count."""
    what = f"hand-off {task} " if task else "a hand-off "
    return (f"root task {root_task}: {what}from {producer} to {consumer} would be hop {hops}, "
            f"past the hop budget of {budget}: refused; the task ends escalated (agents "
            f"passing it on: {producer}, {consumer})")


# -- reading the inbox -------------------------------------------------------------------------

def classify(name: str, data: bytes | None) -> Item:
    """An inbox entry as an :class:`Item` (``thread`` ``None`` when it is neither a chat
    message nor a team file)."""
    if data is None:
        return Item(name=name, thread=None)
    try:
        obj = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, ValueError):
        return Item(name=name, thread=None)
    if isinstance(obj, dict) and obj.get("kind") == "task":
        return _team_item(name, obj)
    try:
        message = parse_message(data)
    except MessageError:
        return Item(name=name, thread=None)
    return Item(name=name, thread=message.thread, person=message.human, id=message.id,
                kind="message", sender=message.sender_name, channel=message.channel,
                text=message.text)


def _team_item(name: str, obj: dict[str, Any]) -> Item:
    thread = obj.get("contextId")
    meta = obj.get("metadata")
    fleet = meta.get("fleet") if isinstance(meta, dict) else None
    if not isinstance(thread, str) or not thread or not isinstance(fleet, dict):
        return Item(name=name, thread=None)
    kind = "result" if fleet.get("type") == "result" else "handoff"
    producer = fleet.get("producer")
    sender = producer.get("agent") if isinstance(producer, dict) else None
    texts = []
    for holder in (*(obj.get("history") or ()), *(obj.get("artifacts") or ())):
        if isinstance(holder, dict):
            for part in holder.get("parts") or ():
                if isinstance(part, dict) and isinstance(part.get("text"), str):
                    texts.append(part["text"])
    channel = fleet.get("channel")
    tid = obj.get("id")
    return Item(name=name, thread=thread, person=False,
                id=tid if isinstance(tid, str) else None, kind=kind,
                sender=sender if isinstance(sender, str) else "",
                channel=channel if isinstance(channel, str) else None, text="\n".join(texts))


def inbox_entries(directory: Path) -> list[tuple[Path, bytes | None]]:
    """A spool directory's message files in inbox order (modification time, then name), each
    with its bytes (``None``: not a regular file, or unreadable now)."""
    listed = []
    try:
        with os.scandir(directory) as it:
            for entry in it:
                if entry.name.endswith(".json") and not entry.name.startswith("."):
                    try:
                        listed.append((entry.stat(follow_symlinks=False).st_mtime_ns,
                                       entry.name))
                    except FileNotFoundError:
                        continue
    except FileNotFoundError:
        return []
    out: list[tuple[Path, bytes | None]] = []
    for _, name in sorted(listed):
        path = Path(directory) / name
        try:
            data: bytes | None = read_message_file(path)
        except FileNotFoundError:
            continue
        except (MessageError, OSError):
            data = None
        out.append((path, data))
    return out


# -- the files ---------------------------------------------------------------------------------

class TeamError(Exception):
    """A person's team action cannot be done (the text says why)."""


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text("utf-8"))
    except (OSError, ValueError, UnicodeDecodeError):
        return None


def _write_json(path: Path, obj: Any) -> None:
    """Atomically: a dot-file, fsync, rename."""
    tmp = path.parent / f".{path.name}.{os.getpid()}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
    try:
        os.write(fd, (json.dumps(obj, sort_keys=True) + "\n").encode("utf-8"))
        os.fsync(fd)
    finally:
        os.close(fd)
    os.rename(tmp, path)
    _sync_dir(path.parent)


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


def append_jsonl(path: Path, record: Mapping[str, Any]) -> None:
    """One JSON line, one ``O_APPEND`` write, after a newline when the file ends in a line cut
    short."""
    line = (json.dumps(record, sort_keys=True) + "\n").encode("utf-8")
    fd = os.open(path, os.O_RDWR | os.O_APPEND | os.O_CREAT, 0o600)
    try:
        end = os.fstat(fd).st_size
        if end and os.pread(fd, 1, end - 1) != b"\n":
            line = b"\n" + line
        os.write(fd, line)
    finally:
        os.close(fd)


class TeamFiles:
    """``STATE/team/``'s person-in-command and hop-budget files for one agent."""

    def __init__(self, state: Path, inbox: Path, processing: Path | None = None) -> None:
        self.state = Path(state)
        self.team = self.state / "team"
        self.inbox = Path(inbox)
        self.processing = Path(processing) if processing else self.state / "processing"

    @property
    def command_dir(self) -> Path:
        """The flags: ``team/command/<enc thread>.json``."""
        return self.team / "command"

    @property
    def paused_dir(self) -> Path:
        """``team/paused/<enc thread>/<seq>-<inbox name>``."""
        return self.team / "paused"

    @property
    def journal(self) -> Path:
        """``team/command.jsonl``: one line per flag set, set again or cleared."""
        return self.team / "command.jsonl"

    @property
    def refused(self) -> Path:
        """``team/refused.jsonl``: an agent's attempt to resume, a deleted flag, a refused
        hop."""
        return self.team / "refused.jsonl"

    @property
    def escalated_dir(self) -> Path:
        """``team/hop-escalated/<enc root task>.json``: the one message per root task."""
        return self.team / "hop-escalated"

    def ensure(self) -> None:
        """Create ``team/`` and its directories (0700: the runner's)."""
        for path in (self.team, self.command_dir, self.paused_dir, self.escalated_dir):
            os.makedirs(path, mode=0o700, exist_ok=True)

    @contextmanager
    def locked(self) -> Iterator[None]:
        """Hold ``team/lock`` (a scan and a clear never interleave)."""
        self.ensure()
        fd = os.open(self.team / "lock", os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)

    # -- reading --

    def flags(self) -> dict[str, Flag]:
        """The flag files, by thread (an unreadable one counts as set, from its name)."""
        out: dict[str, Flag] = {}
        try:
            names = sorted(os.listdir(self.command_dir))
        except FileNotFoundError:
            return out
        for name in names:
            if name.startswith(".") or not name.endswith(".json"):
                continue
            obj = _read_json(self.command_dir / name)
            try:
                flag = Flag.from_json(obj if isinstance(obj, dict) else {})
            except ValueError:
                try:
                    thread = decode_name(name[:-5])
                except ValueError:
                    continue
                flag = Flag(thread=thread, set=0.0, by_message=None, person=None, channel=None)
            out[flag.thread] = flag
        return out

    def paused(self) -> dict[str, list[str]]:
        """Each paused thread's file names in their order."""
        out: dict[str, list[str]] = {}
        try:
            dirs = sorted(os.listdir(self.paused_dir))
        except FileNotFoundError:
            return out
        for name in dirs:
            try:
                thread = decode_name(name)
            except ValueError:
                continue
            names = paused_order(os.listdir(self.paused_dir / name))
            if names:
                out[thread] = names
        return out

    def commanded_in_journal(self) -> dict[str, Flag]:
        """Threads whose last journal line is ``set``."""
        last: dict[str, Flag | None] = {}
        try:
            lines = self.journal.read_text("utf-8").splitlines()
        except (OSError, UnicodeDecodeError):
            return {}
        for line in lines:
            try:
                record = json.loads(line)
                if not isinstance(record, dict):
                    continue
                flag = Flag.from_json(record.get("flag") or {})
            except ValueError:
                continue
            last[flag.thread] = flag if record.get("event") == "set" else None
        return {t: f for t, f in last.items() if f is not None}

    def in_flight(self) -> frozenset[str]:
        """Threads of this agent's sent hand-offs still in flight (``team/sent/``)."""
        threads = set()
        try:
            names = os.listdir(self.team / "sent")
        except FileNotFoundError:
            return frozenset()
        for name in names:
            if name.startswith(".") or not name.endswith(".json"):
                continue
            obj = _read_json(self.team / "sent" / name)
            if isinstance(obj, dict) and obj.get("state") in IN_FLIGHT_STATES \
                    and isinstance(obj.get("thread"), str):
                threads.add(obj["thread"])
        return frozenset(threads)

    def view(self) -> TeamView:
        """What the runner knows of its threads now."""
        return TeamView(flags=self.flags(), paused=self.paused(), in_flight=self.in_flight(),
                        journal=self.commanded_in_journal())

    def flag(self, thread: str) -> Flag | None:
        """The thread's flag, or ``None``."""
        return self.flags().get(thread)

    # -- writing --

    def _flag_path(self, thread: str) -> Path:
        return self.command_dir / f"{encode_name(thread)}.json"

    def set_flag(self, flag: Flag, event: str = "set") -> None:
        """Write the flag (and its journal line first: the journal is what sets it again)."""
        self.ensure()
        append_jsonl(self.journal, {"time": time.time(), "event": event,
                                    "flag": flag.to_json()})
        _write_json(self._flag_path(flag.thread), flag.to_json())

    def pause(self, source: Path, thread: str) -> Path:
        """Move one inbox (or processing) file to the end of ``thread``'s paused files."""
        directory = self.paused_dir / encode_name(thread)
        os.makedirs(directory, mode=0o700, exist_ok=True)
        dest = directory / paused_name(next_seq(os.listdir(directory)), source.name)
        os.rename(source, dest)
        _sync_dir(directory)
        return dest

    def record_refused(self, record: Mapping[str, Any]) -> None:
        """Append one line to ``team/refused.jsonl``."""
        self.ensure()
        append_jsonl(self.refused, record)

    def clear(self, thread: str) -> list[Path]:
        """The person's action (also finishes a clear cut short): mark the flag clearing, give
        the paused files their planned times (:func:`plan_clear`), put them back into the inbox
        in their order, remove the flag. Returns where the files went, in order. The caller
        holds :meth:`locked`.

        Raises:
            TeamError: the thread has no flag and nothing paused.
        """
        flag = self.flag(thread)
        directory = self.paused_dir / encode_name(thread)
        names = paused_order(os.listdir(directory)) if directory.is_dir() else []
        if flag is None and not names:
            raise TeamError(f"thread {thread}: no person is in command of it (no flag in "
                            f"{self.command_dir})")
        if flag is not None and not flag.clearing:
            flag = Flag(**{**flag.to_json(), "clearing": True})
            _write_json(self._flag_path(thread), flag.to_json())
        plan = plan_clear(thread, [(n, os.lstat(directory / n).st_mtime_ns) for n in names])
        for name, _, mtime_ns in plan.moves:  # all times first: a redo plans the same ones
            os.utime(directory / name, ns=(mtime_ns, mtime_ns), follow_symlinks=False)
        moved = []
        for name, inbox_name, _ in plan.moves:
            dest = self.inbox / inbox_name
            n = 1
            while os.path.lexists(dest):
                dest = self.inbox / f"{inbox_name[:-5]}.{n}.json"
                n += 1
            os.rename(directory / name, dest)
            moved.append(dest)
        _sync_dir(self.inbox)
        try:
            os.rmdir(directory)
        except OSError:
            pass
        append_jsonl(self.journal, {"time": time.time(), "event": "cleared",
                                    "flag": (flag or Flag(thread, 0.0, None, None, None))
                                    .to_json(), "resumed": [p.name for p in moved]})
        try:
            os.unlink(self._flag_path(thread))
        except FileNotFoundError:
            pass
        _sync_dir(self.command_dir)
        return moved

    def finish_clears(self) -> list[str]:
        """Finish every clear a crash cut short (a flag marked ``clearing``); return the
        threads. The caller holds :meth:`locked`."""
        done = []
        for thread, flag in self.flags().items():
            if flag.clearing:
                self.clear(thread)
                done.append(thread)
        return done

    def hop_escalation_due(self, root_task: str, record: Mapping[str, Any]) -> bool:
        """Whether the one hop-budget message of ``root_task`` is still to be sent: ``True``
        the first time (a marker is written, ``sent: false``), or when a marker says it was not
        sent (a crash between marker and message); ``False`` once :meth:`hop_escalated`."""
        self.ensure()
        path = self.escalated_dir / f"{encode_name(root_task)}.json"
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        except FileExistsError:
            obj = _read_json(path)
            return not (isinstance(obj, dict) and obj.get("sent") is True)
        try:
            os.write(fd, (json.dumps({**record, "root_task": root_task, "sent": False},
                                     sort_keys=True) + "\n").encode("utf-8"))
            os.fsync(fd)
        finally:
            os.close(fd)
        return True

    def hop_escalated(self, root_task: str, escalation: Mapping[str, Any]) -> None:
        """Mark ``root_task``'s hop-budget message sent."""
        path = self.escalated_dir / f"{encode_name(root_task)}.json"
        obj = _read_json(path)
        _write_json(path, {**(obj if isinstance(obj, dict) else {}), "root_task": root_task,
                           "sent": True, "escalation": dict(escalation)})


def scan(files: TeamFiles, entries: Sequence[tuple[Path, bytes | None]],
         now: float | None = None) -> tuple[ScanPlan, list[Path]]:
    """Carry out a scan (the caller holds :meth:`TeamFiles.locked`): finish clears cut short,
    write the flags, pause, record. ``entries`` are ``(path, bytes or None)`` in inbox order.
    Returns the plan and the paths the person messages to run first are at."""
    now = time.time() if now is None else now
    items = [classify(path.name, data) for path, data in entries]
    plan = plan_scan(files.view(), items, now)
    if plan.finish_clears:  # the caller finishes them first (finish_clears): defensive
        files.finish_clears()
        plan = plan_scan(files.view(), items, now)
    for flag in plan.set_flags:
        files.set_flag(flag, event="set")
    by_name = {path.name: path for path, _ in entries}
    for name, thread in plan.pause:
        try:
            files.pause(by_name[name], thread)
        except FileNotFoundError:
            continue  # taken meanwhile
    for record in plan.refused:
        files.record_refused(record)
    return plan, [by_name[n] for n in plan.first]


def take_command(files: TeamFiles, *, log: Callable[[str], None], release: Path, outbox: Path,
                 agent: str, clear_hint: Callable[[str], str]) -> list[Path]:
    """The loop's first act at each step, before anything else runs: finish clears cut short,
    scan ``processing/`` and the inbox, set flags, pause, record; then say the one line of
    each flag newly set (logged, and posted to the thread's channel). Returns the person
    messages to take first, in order. ``clear_hint(thread)`` is the person's command."""
    with files.locked():
        files.finish_clears()
        entries = [*inbox_entries(files.processing), *inbox_entries(files.inbox)]
        plan, first = scan(files, entries)
    for thread in plan.finish_clears:
        log(f"thread {thread}: finished a clear cut short; its paused hand-offs are back in "
            "the inbox in their order")
    for record in plan.refused:
        log(f"thread {record['thread']}: refused ({record['what']}): {record['reason']}")
    for name, thread in plan.pause:
        log(f"thread {thread}: {name} paused (a person is in command)")
    for flag in plan.announce:
        line = command_line(flag)
        log(f"{line}; to clear: {clear_hint(flag.thread)}")
        posted = post_line(release=release, outbox=outbox, agent=agent,
                           task=flag.by_message or flag.thread, channel=flag.channel,
                           text=line)
        if posted["error"]:
            log(f"thread {flag.thread}: the in-command line was posted via {posted['via']} "
                f"({posted['error']})")
    return first


def escalate_hop_budget(files: TeamFiles, *, release: Path, spool: Path, agent: str,
                        task: str, root_task: str, producer: str, consumer: str, hops: int,
                        budget: int, handoff: str | None = None) -> dict[str, Any] | None:
    """A refused hop: recorded in ``refused.jsonl`` every time, and the one message per root
    task sent if it is still due (:meth:`TeamFiles.hop_escalation_due`). Returns the
    escalation's ``{"via", "id", "error"}``, or ``None`` when it was sent already."""
    from fleet_runner.escalate import escalate

    reason = hop_text(root_task=root_task, producer=producer, consumer=consumer, hops=hops,
                      budget=budget, task=handoff)
    record = {"time": time.time(), "what": HOP_BUDGET, "task": task, "root_task": root_task,
              "handoff": handoff, "producer": producer, "consumer": consumer, "hops": hops,
              "hop_budget": budget, "reason": reason}
    files.record_refused(record)
    if not files.hop_escalation_due(root_task, record):
        return None
    sent = escalate(release=release, spool=spool, env=os.environ, agent=agent, task=task,
                    kind=HOP_BUDGET, failures=0, reason=reason, detail="")
    if sent.get("via"):
        files.hop_escalated(root_task, sent)
    return sent


def post_line(*, release: Path, outbox: Path, agent: str, task: str, channel: str | None,
              text: str) -> dict[str, Any]:
    """Post one line to ``channel`` with the release's ``reply`` CLI (not recorded as the
    agent's send: no ``FLEET_SENDS_LOG``); written into the outbox by the runner when the CLI is
    missing or fails. Returns ``{"via", "error"}``."""
    if not channel:
        return {"via": None, "error": "no channel"}
    cli = Path(release) / "skills" / "reply" / "bin" / "reply"
    error = None
    if os.path.isfile(cli):
        argv = [os.fspath(cli)] if os.access(cli, os.X_OK) else [sys.executable, os.fspath(cli)]
        env = {k: v for k, v in os.environ.items()
               if k not in ("FLEET_SENDS_LOG", "FLEET_DENIALS_LOG")}
        try:
            done = subprocess.run([*argv, f"--task={task}", f"--channel={channel}", "-"],
                                  input=text.encode("utf-8"), capture_output=True,
                                  env={**env, "FLEET_OUTBOX": os.fspath(outbox),
                                       "FLEET_AGENT": agent},
                                  timeout=POST_TIMEOUT_S)
            if done.returncode == 0:
                return {"via": "reply-cli", "error": None}
            error = f"reply exited {done.returncode}: " \
                    f"{done.stderr.decode(errors='replace')[-300:]}"
        except (OSError, ValueError, subprocess.TimeoutExpired) as exc:
            error = f"reply failed: {exc}"
    else:
        error = f"{cli}: not in this release"
    message = {"id": str(uuid.uuid4()), "task": task, "channel": channel, "text": text,
               "reply_to": None, "agent": agent, "time": time.time(), "via": "runner-fallback"}
    try:
        os.makedirs(outbox, exist_ok=True)
        tmp = Path(outbox) / f".{message['id']}"
        tmp.write_text(json.dumps(message), "utf-8")
        os.rename(tmp, Path(outbox) / f"{message['id']}.json")
    except OSError as exc:
        print("fleet-runner: " + one_line(f"LINE NOT POSTED to {channel}: {text} [{error}; "
                                          f"outbox: {exc}]"), file=sys.stderr, flush=True)
        return {"via": None, "error": f"{error}; outbox: {exc}"}
    return {"via": "runner-fallback", "error": error}

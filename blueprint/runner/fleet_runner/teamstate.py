"""The team's files in an agent's state: what it received, what it sent, and the boundary.

:func:`receive` is THE boundary a hand-off or result crosses into an agent, used alike by local
delivery (a runner handing work to an agent on its own host) and by the relay's forced command
on another host. It takes the bytes as they travelled and answers with an :class:`Ack`:

1. the bytes are parsed (:func:`fleet_runner.handoff.parse_team_file`): not UTF-8, a wrong
   shape or a changed byte of the brief is refused (``not-utf8``, ``bad-shape``,
   ``digest-mismatch``); then the roster: the agent it is for must run on this host and the
   agent it is from must be in the fleet, on the host it came from (``unknown-consumer``,
   ``bad-shape``); a hand-off past its hop budget is refused (``hop-budget``);
2. **exactly once**, by id and digest: ``STATE/team/received/<enc id>.json`` records
   ``{id, digest, type, from, received, delivered}``, the bytes beside it in
   ``<enc id>.bytes``. The same id with the same digest again (a retry after a lost
   acknowledgement) is a ``duplicate``: nothing new reaches the agent. The same id with
   another digest is refused (``id-reused``) and the first is kept. Two files with the same
   text and different ids are two tasks;
3. the drop into the agent's inbox, crash-safe: the file is first staged as a dot-file in
   ``inbox/`` (the runner skips dot-files), then the record is written (the receive is now
   accepted), then the dot-file is renamed to ``handoff-<enc id>.json`` or
   ``result-<enc id>.json``, then the record says ``delivered``. A receive cut short after the
   record is finished by the retry (its answer is ``duplicate``): if the staged file is still
   there it is renamed, if not the rename had happened; it is never dropped twice.

A result received is also recorded in the asking agent's ``team/sent/<enc id>.json``
(``state: "answered"``, ``result: {state, summary, received}``), so a deadline is not
escalated once the answer is in, even before the agent runs on it.

The sender's side: ``team/sent/<enc id>.json`` per hand-off sent (:func:`record_sent`,
:func:`mark_delivery`: ``pending`` until an ack, ``delivered``, ``refused`` with the
receiver's reason, ``answered``; ``tries`` and ``last_error`` count transport failures, and
the bytes are kept in ``<enc id>.bytes`` so a retry sends exactly the same bytes), and
``team/answers/<enc id>.json`` per result sent back. :func:`deliver` sends one file: into an
agent's state on this host with :func:`receive`, or to another host through the relay
function it is given.

Standard library only; no side effects on import.
"""

from __future__ import annotations

import fcntl
import json
import os
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fleet_runner.handoff import (
    BAD_SHAPE,
    Handoff,
    HandoffError,
    Result,
    file_digest,
    parse_team_file,
    parse_when,
)
from fleet_runner.names import encode_name
from fleet_runner.records import now_iso, read_json, write_json_atomic
from fleet_runner.roster import RelayEntry, Roster

ACCEPTED, DUPLICATE, REFUSED = "accepted", "duplicate", "refused"
UNKNOWN_CONSUMER, ID_REUSED, HOP_BUDGET = "unknown-consumer", "id-reused", "hop-budget"
PENDING, DELIVERED, ANSWERED = "pending", "delivered", "answered"


class TransportError(Exception):
    """A file could not be handed over now (no relay, a cut connection, a full disk): it stays
    pending and is tried again."""


@dataclass(frozen=True, slots=True)
class Ack:
    """The receiver's answer, one JSON line on the wire.

    Attributes:
        status: ``accepted``, ``duplicate`` (already received: nothing new) or ``refused``.
        code: the refusal code (``None`` unless refused).
        reason: one line saying why it was refused.
        digest: ``sha256:<hex>`` of the bytes received.
        id: the task id, when the bytes held one.
    """

    status: str
    code: str | None
    reason: str | None
    digest: str
    id: str | None

    @property
    def ok(self) -> bool:
        """Whether the receiver has the file (accepted now or before)."""
        return self.status in (ACCEPTED, DUPLICATE)

    def to_line(self) -> str:
        """The ack as one line of JSON (no newline)."""
        return json.dumps({"status": self.status, "code": self.code, "reason": self.reason,
                           "digest": self.digest, "id": self.id}, sort_keys=True)

    @classmethod
    def from_line(cls, line: str) -> Ack:
        """Read an ack line.

        Raises:
            ValueError: not an ack.
        """
        obj = json.loads(line)
        if not isinstance(obj, dict) or obj.get("status") not in (ACCEPTED, DUPLICATE,
                                                                   REFUSED):
            raise ValueError(f"not an ack: {line[:200]!r}")
        return cls(status=obj["status"], code=obj.get("code"), reason=obj.get("reason"),
                   digest=str(obj.get("digest")), id=obj.get("id"))


def _refused(code: str, reason: str, digest: str, tid: str | None) -> Ack:
    return Ack(status=REFUSED, code=code, reason=reason, digest=digest, id=tid)


def received_dir(state: Path) -> Path:
    """``STATE/team/received``."""
    return Path(state) / "team" / "received"


def sent_dir(state: Path) -> Path:
    """``STATE/team/sent``: one record per hand-off this agent sent."""
    return Path(state) / "team" / "sent"


def answers_dir(state: Path) -> Path:
    """``STATE/team/answers``: one record per result this agent sent back."""
    return Path(state) / "team" / "answers"


def inbox_name(kind: str, tid: str) -> str:
    """The inbox file name of a received hand-off or result."""
    return f"{kind}-{encode_name(tid)}.json"


@contextmanager
def _locked(directory: Path) -> Iterator[None]:
    os.makedirs(directory, mode=0o700, exist_ok=True)
    fd = os.open(directory / ".lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def _write_bytes_synced(path: Path, data: bytes) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with open(tmp, "wb") as fh:
        fh.write(data)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)


def _sync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _check_roster(obj: Handoff | Result, roster: Roster, host: str, agent: str | None,
                  sender_host: str | None) -> tuple[str, str] | None:
    """``(code, reason)`` when the roster refuses ``obj`` here, else ``None``."""
    to = obj.consumer
    if agent is not None and to.agent != agent:
        return UNKNOWN_CONSUMER, (f"it is for {to.agent} on {to.host}, but was handed to "
                                  f"{agent}")
    known = roster.agents.get(to.agent)
    if to.host != host or known is None or known.host != host:
        where = f"runs on {known.host}" if known else "is not an agent of the fleet"
        return UNKNOWN_CONSUMER, (f"no agent {to.agent} on host {host} (metadata.fleet."
                                  f"consumer: {to.agent} on {to.host}; {to.agent} {where})")
    sender = roster.agents.get(obj.producer.agent)
    if sender is None or sender.host != obj.producer.host:
        return BAD_SHAPE, (f"metadata.fleet.producer: {obj.producer.agent} on "
                           f"{obj.producer.host} is not an agent of the fleet there")
    if sender_host is not None and obj.producer.host != sender_host:
        return BAD_SHAPE, (f"metadata.fleet.producer: on host {obj.producer.host}, but it came "
                           f"through the relay of host {sender_host}")
    return None


def receive(data: bytes, *, state_root: Path, host: str, roster: Roster,
            agent: str | None = None, sender_host: str | None = None) -> Ack:
    """Take a hand-off or result into the state of the agent it is for (module docstring).

    Args:
        data: the file's bytes as they travelled.
        state_root: the host's state root (``<root>/state``): the agent's state is
            ``state_root/<agent>``.
        host: this host's name.
        roster: the fleet (``team.json``).
        agent: the agent the caller hands it to, or ``None`` (the relay: the file names it);
            a file for another agent is refused.
        sender_host: the host it came from through the relay (``--from``), or ``None``
            (local delivery).

    Raises:
        OSError: the state cannot be written now (the sender keeps it pending and retries;
            a retry finishes what was begun).
    """
    digest = file_digest(data)
    try:
        obj = parse_team_file(data)
    except HandoffError as exc:
        return _refused(exc.code, exc.text, digest, _peek_id(data))
    refusal = _check_roster(obj, roster, host, agent, sender_host)
    if refusal:
        return _refused(refusal[0], refusal[1], digest, obj.id)
    if isinstance(obj, Handoff) and obj.hops > obj.hop_budget:
        return _refused(HOP_BUDGET, f"hop {obj.hops} of root task {obj.root_task} is past its "
                        f"budget of {obj.hop_budget} hops", digest, obj.id)
    state = Path(state_root) / obj.consumer.agent
    directory = received_dir(state)
    with _locked(directory):
        record_path = directory / f"{encode_name(obj.id)}.json"
        record = read_json(record_path)
        if isinstance(record, dict):
            if record.get("digest") != digest:
                return _refused(ID_REUSED, (
                    f"task id {obj.id} was already received with other content "
                    f"({record.get('type')} from {record.get('from')}, {record.get('digest')}, at "
                    f"{record.get('received')}): the first is kept; send new work under a new "
                    "id"), digest, obj.id)
            if not record.get("delivered"):
                _drop(state, obj, record_path, record)
            return Ack(status=DUPLICATE, code=None, reason=None, digest=digest, id=obj.id)
        inbox = state / "inbox"
        os.makedirs(inbox, mode=0o700, exist_ok=True)
        staged = inbox / f".{inbox_name(obj.type, obj.id)}.staged"
        _write_bytes_synced(staged, data)
        _write_bytes_synced(directory / f"{encode_name(obj.id)}.bytes", data)
        record = {"id": obj.id, "digest": digest, "type": obj.type,
                  "from": f"{obj.producer.agent}@{obj.producer.host}", "received": now_iso(),
                  "via": "relay" if sender_host is not None else "local", "delivered": False}
        write_json_atomic(record_path, record)
        _drop(state, obj, record_path, record)
    if isinstance(obj, Result):
        record_result(state, obj)
    return Ack(status=ACCEPTED, code=None, reason=None, digest=digest, id=obj.id)


def _drop(state: Path, obj: Handoff | Result, record_path: Path,
          record: dict[str, Any]) -> None:
    """Rename the staged dot-file into the inbox (unless that happened already), then mark the
    record delivered."""
    inbox = state / "inbox"
    name = inbox_name(obj.type, obj.id)
    staged = inbox / f".{name}.staged"
    if os.path.lexists(staged):
        dest = inbox / name
        n = 1
        while os.path.lexists(dest):  # a finished file of another kind cannot share it
            dest = inbox / f"{name[:-5]}.{n}.json"
            n += 1
        os.rename(staged, dest)
        _sync_dir(inbox)
    # No staged file: it was renamed before the crash (the record exists only after the
    # staged file was written).
    write_json_atomic(record_path, {**record, "delivered": True, "delivered_at": now_iso()})


def _peek_id(data: bytes) -> str | None:
    try:
        value = json.loads(data.decode("utf-8")).get("id")
    except (UnicodeDecodeError, ValueError, AttributeError):
        return None
    return value if isinstance(value, str) and len(value) <= 128 else None


# -- the sender's side ------------------------------------------------------------------------

def _record_path(directory: Path, tid: str) -> Path:
    return directory / f"{encode_name(tid)}.json"


def record_sent(state: Path, handoff: Handoff, data: bytes, *, thread_channel: str | None = None
                ) -> dict[str, Any]:
    """Record a hand-off about to be sent (``pending``) with its bytes; return the record.

    A record already there for the same hand-off (same consumer, brief and expected result:
    a retried attempt dispatching it again, whose deadline and timestamp differ) is returned
    as it is, and its first bytes are the ones sent: the receiver sees one hand-off.

    Raises:
        HandoffError: ``id-reused``: this agent already sent another hand-off under the id.
    """
    directory = sent_dir(state)
    os.makedirs(directory, mode=0o700, exist_ok=True)
    path = _record_path(directory, handoff.id)
    digest = file_digest(data)
    old = read_json(path)
    if isinstance(old, dict):
        same = (old.get("brief_sha256"), old.get("consumer"), old.get("host"),
                old.get("expected")) == (handoff.brief_sha256, handoff.consumer.agent,
                                         handoff.consumer.host, handoff.expected)
        if not same:
            raise HandoffError(ID_REUSED, f"task id {handoff.id} was already sent as another "
                               f"hand-off (to {old.get('consumer')} on {old.get('host')}, "
                               f"{old.get('sent')}): dispatch new work under a new id")
        return old
    _write_bytes_synced(directory / f"{encode_name(handoff.id)}.bytes", data)
    record = {"id": handoff.id, "consumer": handoff.consumer.agent,
              "host": handoff.consumer.host, "digest": digest,
              "brief_sha256": handoff.brief_sha256, "state": PENDING, "tries": 0,
              "last_error": None, "deadline": handoff.deadline, "root_task": handoff.root_task,
              "parent_task": handoff.parent_task, "thread": handoff.thread,
              "channel": handoff.channel if handoff.channel is not None else thread_channel,
              "hops": handoff.hops, "expected": handoff.expected, "sent": now_iso(),
              "result": None, "deadline_escalated": False}
    write_json_atomic(path, record)
    return record


def record_answer(state: Path, result: Result, data: bytes) -> dict[str, Any]:
    """Record a result about to be sent back (``pending``) with its bytes; return the record
    (the one already there for the same bytes)."""
    directory = answers_dir(state)
    os.makedirs(directory, mode=0o700, exist_ok=True)
    path = _record_path(directory, result.id)
    digest = file_digest(data)
    old = read_json(path)
    if isinstance(old, dict) and old.get("digest") == digest:
        return old
    _write_bytes_synced(directory / f"{encode_name(result.id)}.bytes", data)
    record = {"id": result.id, "consumer": result.consumer.agent, "host": result.consumer.host,
              "digest": digest, "state": PENDING, "tries": 0, "last_error": None,
              "result_state": result.state, "sent": now_iso()}
    write_json_atomic(path, record)
    return record


def mark_delivery(path: Path, *, ack: Ack | None = None, error: str | None = None
                  ) -> dict[str, Any]:
    """Update a sent or answer record after a delivery try: an ack that has it (accepted or
    duplicate) makes it ``delivered``, a refusal ``refused`` with the receiver's reason, a
    transport ``error`` leaves it ``pending`` with ``tries`` counted. Returns the record."""
    record = read_json(path) or {}
    record["tries"] = int(record.get("tries") or 0) + 1
    record["last_try"] = now_iso()
    if ack is not None and ack.ok:
        if record.get("state") != ANSWERED:
            record["state"] = DELIVERED
        record["ack"] = ack.status
        record["last_error"] = None
    elif ack is not None:
        record["state"] = "refused"
        record["refusal"] = {"code": ack.code, "reason": ack.reason}
        record["last_error"] = f"refused ({ack.code}): {ack.reason}"
    else:
        record["last_error"] = error
    write_json_atomic(path, record)
    return record


def record_result(state: Path, result: Result) -> dict[str, Any]:
    """Record a result that came back in the asking agent's ``team/sent/<enc id>.json``
    (``answered``); a result for a hand-off with no record gets one."""
    directory = sent_dir(state)
    os.makedirs(directory, mode=0o700, exist_ok=True)
    path = _record_path(directory, result.id)
    record = read_json(path)
    if not isinstance(record, dict):
        record = {"id": result.id, "consumer": result.producer.agent,
                  "host": result.producer.host, "digest": None, "tries": 0,
                  "last_error": None, "deadline": None, "root_task": result.root_task,
                  "parent_task": result.parent_task, "thread": result.thread,
                  "channel": result.channel, "hops": result.hops,
                  "deadline_escalated": False}
    if not record.get("result"):
        record["result"] = {"state": result.state, "summary": result.summary,
                            "files": list(result.files), "outcome": result.outcome,
                            "received": now_iso()}
    record["state"] = ANSWERED
    write_json_atomic(path, record)
    return record


def records(directory: Path) -> list[tuple[Path, dict[str, Any]]]:
    """Every record of a ``team/sent`` or ``team/answers`` directory, oldest first."""
    out = []
    try:
        names = sorted(n for n in os.listdir(directory)
                       if n.endswith(".json") and not n.startswith("."))
    except FileNotFoundError:
        return []
    for name in names:
        try:
            record = read_json(directory / name)
        except (OSError, ValueError):
            continue
        if isinstance(record, dict):
            out.append((directory / name, record))
    return sorted(out, key=lambda item: str(item[1].get("sent") or ""))


def pending(directory: Path) -> list[tuple[Path, dict[str, Any], bytes]]:
    """The records still ``pending`` with the bytes to send (a record whose bytes are gone is
    left out)."""
    out = []
    for path, record in records(directory):
        if record.get("state") != PENDING:
            continue
        try:
            data = path.with_suffix(".bytes").read_bytes()
        except OSError:
            continue
        out.append((path, record, data))
    return out


def overdue(state: Path, now: float | None = None) -> list[tuple[Path, dict[str, Any]]]:
    """Sent hand-offs past their deadline with no result, not yet escalated."""
    now = time.time() if now is None else now
    out = []
    for path, record in records(sent_dir(state)):
        if record.get("result") or record.get("deadline_escalated") or record.get(
                "state") == "refused":
            continue
        try:
            if parse_when(str(record.get("deadline"))) <= now:
                out.append((path, record))
        except ValueError:
            continue
    return out


def mark_escalated(path: Path) -> None:
    """Note that a sent hand-off's missed deadline was escalated (never again)."""
    record = read_json(path) or {}
    record["deadline_escalated"] = True
    record["deadline_escalated_at"] = now_iso()
    write_json_atomic(path, record)


RelaySend = Callable[[RelayEntry, bytes, float], Ack]
"""``relay.send(entry, data, timeout_s) -> Ack`` (relay.py)."""


def deliver(data: bytes, obj: Handoff | Result, *, state_root: Path, roster: Roster,
            relay_send: RelaySend | None, timeout_s: float = 60.0) -> Ack:
    """Hand one file to the agent it is for: :func:`receive` when that agent runs on this
    host, else ``relay_send`` to its host.

    Raises:
        TransportError: it could not be handed over now (no relay to that host, the relay
            failed, the state could not be written): keep it pending and retry.
    """
    to = obj.consumer
    if to.host == roster.host:
        try:
            return receive(data, state_root=state_root, host=roster.host, roster=roster,
                           agent=to.agent)
        except OSError as exc:
            raise TransportError(f"cannot write into {to.agent}'s state: {exc}") from None
    entry = roster.relays.get(to.host)
    if entry is None:
        raise TransportError(f"no relay from {roster.host} to host {to.host} in the roster")
    if relay_send is None:
        raise TransportError(f"{to.host} is another host and this runner has no relay "
                             "(relay.py) yet")
    try:
        return relay_send(entry, data, timeout_s)
    except TransportError:
        raise
    except Exception as exc:  # noqa: BLE001 - every failure of the wire is "try again later"
        raise TransportError(f"relay to {to.host} failed: {exc}") from None


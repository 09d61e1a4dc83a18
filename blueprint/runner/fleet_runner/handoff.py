"""Hand-offs and results: the typed files agents send each other, shaped as A2A v0.3.0 Tasks.

A **hand-off** is a task one agent (the producer) gives a teammate (the consumer); its
**result** is the typed answer, with the same task id. Both travel as one UTF-8 JSON object
shaped as a ``Task`` of the A2A Protocol Specification v0.3.0 (``kind: "task"``, ``id``,
``contextId`` = the thread, ``status.state`` from A2A's set, the brief as the text part of a
``user`` message in ``history``, the summary as the text part of an artifact), with the fleet's
own fields under ``metadata.fleet`` (docs/runner.md, "Hand-offs", shows both). The runner
implements the shape; it needs no A2A SDK.

Parsing is strict, at the boundary: :func:`parse_team_file` either returns a whole
:class:`Handoff` or :class:`Result` or raises :class:`HandoffError` with a refusal code the
sender is told (``not-utf8``, ``bad-shape``, ``digest-mismatch``) and a text naming the key
and what is wrong. Nothing is guessed: a missing key is an error, never a default.

:func:`encode` is the one byte form the runner writes (sorted keys, ASCII with ``\\u``
escapes, no spaces, one line and a newline), so the digest of a file it writes never depends
on who wrote it. :func:`file_digest` is that digest (``sha256:<hex>`` of the bytes as they
travel); ``brief_sha256``/``summary_sha256`` inside are the hex sha256 of the text's UTF-8
bytes, checked on every parse, so a changed byte of the text is refused even when the
file's own digest was recomputed.

Standard library only; no side effects on import.
"""

from __future__ import annotations

import calendar
import hashlib
import json
import re
import time
from dataclasses import dataclass, field
from typing import Any

from fleet_runner.inbox import _ID

A2A_VERSION = "0.3.0"
"""The A2A Protocol Specification version whose ``Task`` shape these files follow."""
SCHEMA_VERSION = 1
"""``metadata.fleet.schema_version`` this runner writes and reads."""
STATES = ("submitted", "working", "input-required", "completed", "failed", "canceled",
          "rejected")
"""A2A's task states (the v0.3.0 ``TaskState`` values this fleet uses)."""
RESULT_STATES = ("completed", "failed", "canceled", "rejected", "input-required")
"""The states a result may carry."""
HANDOFF, RESULT = "handoff", "result"
MAX_FILE_BYTES = 4 * 1024 * 1024
"""The largest hand-off or result file accepted, in bytes (a brief of a few hundred
kilobytes fits many times over)."""
DEFAULT_HOP_BUDGET = 6
"""Hops a root task may take when the agent config sets none."""

NOT_UTF8, BAD_SHAPE, DIGEST_MISMATCH = "not-utf8", "bad-shape", "digest-mismatch"
_HEX64 = re.compile(r"[0-9a-f]{64}")
_WHEN = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d{1,6})?Z")
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._@+-]{0,127}")
"""An agent or host name: the inbox id rule without ``:``."""


class HandoffError(Exception):
    """A hand-off or result file is refused: ``code`` is the refusal code, ``text`` why.

    Attributes:
        code: one of ``not-utf8``, ``bad-shape``, ``digest-mismatch``.
        text: one line naming the key and what is wrong.
    """

    def __init__(self, code: str, text: str) -> None:
        super().__init__(f"{code}: {text}")
        self.code, self.text = code, text


@dataclass(frozen=True, slots=True)
class Party:
    """One end of a hand-off: an agent and the host it runs on."""

    agent: str
    host: str

    def to_wire(self) -> dict[str, str]:
        """``{"agent", "host"}``."""
        return {"agent": self.agent, "host": self.host}


@dataclass(frozen=True, slots=True)
class Handoff:
    """A typed task one agent gives a teammate.

    Attributes:
        id: the task id (the inbox id rule); the consumer's task is named by it.
        thread: the A2A ``contextId``: the conversation the task belongs to.
        brief: the task's text, exactly as the producer wrote it.
        expected: what must come back.
        deadline: ISO-8601 UTC (``...Z``) by which a result is expected.
        producer: who asks.
        consumer: who is asked.
        root_task: the task the whole chain started from (a person's message).
        parent_task: the producer's task that dispatched this one.
        channel: the person's channel of the thread, or ``None``.
        hops: this hand-off's hop count from the root task (the first hand-off is 1).
        hop_budget: the most hops the root task may take.
        submitted: when it was built (``status.timestamp``).
    """

    id: str
    thread: str
    brief: str
    expected: str
    deadline: str
    producer: Party
    consumer: Party
    root_task: str
    parent_task: str
    channel: str | None
    hops: int
    hop_budget: int
    submitted: str
    type: str = field(default=HANDOFF, init=False)

    @property
    def brief_sha256(self) -> str:
        """The hex sha256 of the brief's UTF-8 bytes."""
        return text_sha256(self.brief)

    def to_wire(self) -> dict[str, Any]:
        """The A2A ``Task`` object of this hand-off."""
        return {
            "kind": "task", "id": self.id, "contextId": self.thread,
            "status": {"state": "submitted", "timestamp": self.submitted},
            "history": [{"kind": "message", "role": "user", "messageId": f"{self.id}#brief",
                         "taskId": self.id, "contextId": self.thread,
                         "parts": [{"kind": "text", "text": self.brief}]}],
            "metadata": {"fleet": {
                "schema_version": SCHEMA_VERSION, "type": HANDOFF,
                "producer": self.producer.to_wire(), "consumer": self.consumer.to_wire(),
                "root_task": self.root_task, "parent_task": self.parent_task,
                "channel": self.channel, "expected": self.expected, "deadline": self.deadline,
                "hops": self.hops, "hop_budget": self.hop_budget,
                "brief_sha256": self.brief_sha256}}}


@dataclass(frozen=True, slots=True)
class Result:
    """The typed answer to a hand-off (same ``id``), sent by its consumer to its producer.

    Attributes:
        id: the hand-off's task id.
        thread: its ``contextId``.
        state: one of :data:`RESULT_STATES`.
        summary: the answer's text.
        producer: who answers (the hand-off's consumer).
        consumer: who asked (the hand-off's producer).
        root_task, parent_task, channel, hops, hop_budget: the hand-off's.
        files: the files the answering agent says it touched (workspace-relative).
        outcome: the answering runner's outcome of the task (``passed``, ``gave-up`` ...).
        timestamp: when it was built (``status.timestamp``).
    """

    id: str
    thread: str
    state: str
    summary: str
    producer: Party
    consumer: Party
    root_task: str
    parent_task: str
    channel: str | None
    hops: int
    hop_budget: int
    files: tuple[str, ...]
    outcome: str | None
    timestamp: str
    type: str = field(default=RESULT, init=False)

    @property
    def summary_sha256(self) -> str:
        """The hex sha256 of the summary's UTF-8 bytes."""
        return text_sha256(self.summary)

    def to_wire(self) -> dict[str, Any]:
        """The A2A ``Task`` object of this result."""
        return {
            "kind": "task", "id": self.id, "contextId": self.thread,
            "status": {"state": self.state, "timestamp": self.timestamp},
            "artifacts": [{"artifactId": f"{self.id}#result",
                           "parts": [{"kind": "text", "text": self.summary}]}],
            "metadata": {"fleet": {
                "schema_version": SCHEMA_VERSION, "type": RESULT,
                "producer": self.producer.to_wire(), "consumer": self.consumer.to_wire(),
                "root_task": self.root_task, "parent_task": self.parent_task,
                "channel": self.channel, "hops": self.hops, "hop_budget": self.hop_budget,
                "summary_sha256": self.summary_sha256, "files": list(self.files),
                "outcome": self.outcome}}}


def text_sha256(text: str) -> str:
    """The hex sha256 of ``text``'s UTF-8 bytes."""
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def file_digest(data: bytes) -> str:
    """``sha256:<hex>`` of a file's bytes as they travel."""
    return "sha256:" + hashlib.sha256(data).hexdigest()


def encode(obj: Handoff | Result | dict[str, Any]) -> bytes:
    """The canonical bytes of a hand-off or result: sorted keys, ASCII (``\\u`` escapes), no
    spaces, one line, then a newline."""
    wire = obj if isinstance(obj, dict) else obj.to_wire()
    return (json.dumps(wire, sort_keys=True, ensure_ascii=True, separators=(",", ":"))
            + "\n").encode("ascii")


def utc_iso(t: float | None = None) -> str:
    """``t`` (default now) as ISO-8601 UTC with a ``Z``, to the second."""
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() if t is None else t))


def parse_when(text: str) -> float:
    """Seconds since the epoch of an ISO-8601 UTC time ``YYYY-MM-DDTHH:MM:SS[.f]Z``.

    Raises:
        ValueError: another form, or no such time.
    """
    if not isinstance(text, str) or not _WHEN.fullmatch(text):
        raise ValueError(f"{str(text)[:40]!r} is not an ISO-8601 UTC time "
                         "(YYYY-MM-DDTHH:MM:SSZ)")
    whole, _, frac = text[:-1].partition(".")
    try:
        parsed = time.strptime(whole, "%Y-%m-%dT%H:%M:%S")
    except ValueError:
        raise ValueError(f"{text!r}: no such time") from None
    return calendar.timegm(parsed) + (float("0." + frac) if frac else 0.0)


_SPAN = re.compile(r"([1-9][0-9]{0,5})([smhd])")
_UNIT_S = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def parse_deadline(text: str, now: float | None = None) -> str:
    """A deadline given as a span from now (``90s``, ``30m``, ``2h``, ``1d``) or an ISO-8601
    UTC time, as ISO-8601 UTC.

    Raises:
        ValueError: neither form, or a time already past.
    """
    now = time.time() if now is None else now
    span = _SPAN.fullmatch(text)
    if span:
        return utc_iso(now + int(span.group(1)) * _UNIT_S[span.group(2)])
    when = parse_when(text)
    if when <= now:
        raise ValueError(f"{text}: already past")
    return text


def _fail(key: str, what: str, code: str = BAD_SHAPE) -> HandoffError:
    return HandoffError(code, f"{key}: {what}")


def _obj(value: Any, key: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise _fail(key, "required, a JSON object")
    return value


def _text(value: Any, key: str, *, empty: bool = False) -> str:
    if not isinstance(value, str) or (not empty and not value):
        raise _fail(key, "required, a " + ("string" if empty else "non-empty string"))
    if any(0xD800 <= ord(ch) <= 0xDFFF for ch in value):
        raise _fail(key, "holds a lone surrogate (\\udXXX), which is not a character: "
                    "the text is not valid UTF-8", NOT_UTF8)
    return value


def _ident(value: Any, key: str) -> str:
    if not isinstance(value, str) or not _ID.fullmatch(value):
        raise _fail(key, "required, 1-128 of letters, digits and ._:@+- (starting with a "
                    "letter or digit)" + (": it is empty" if value == "" else ""))
    return value


def _party(value: Any, key: str) -> Party:
    obj = _obj(value, key)
    names = []
    for part in ("agent", "host"):
        name = obj.get(part)
        if not isinstance(name, str) or not _NAME.fullmatch(name):
            raise _fail(f"{key}.{part}", "required, a name: 1-128 of letters, digits and "
                        "._@+- (starting with a letter or digit)")
        names.append(name)
    return Party(agent=names[0], host=names[1])


def _count(value: Any, key: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise _fail(key, "required, a whole number, 0 or more")
    return value


def _when(value: Any, key: str) -> str:
    try:
        parse_when(value)
    except ValueError as exc:
        raise _fail(key, str(exc)) from None
    return str(value)


def _one_text_part(parts: Any, key: str) -> str:
    if not isinstance(parts, list) or len(parts) != 1:
        raise _fail(key, 'required, exactly one part: [{"kind": "text", "text": ...}]')
    part = _obj(parts[0], f"{key}[0]")
    if part.get("kind") != "text":
        raise _fail(f"{key}[0].kind", 'must be "text" (only text parts are carried)')
    return _text(part.get("text"), f"{key}[0].text", empty=True)


def parse_team_file(data: bytes) -> Handoff | Result:
    """Parse and validate a hand-off or result file's bytes.

    Raises:
        HandoffError: ``not-utf8`` (the bytes, or a text in them, are not UTF-8),
            ``digest-mismatch`` (the brief or summary does not match its sha256) or
            ``bad-shape`` (anything else: the text names the key).
    """
    if len(data) > MAX_FILE_BYTES:
        raise HandoffError(BAD_SHAPE, f"the file is {len(data)} bytes, more than the "
                           f"{MAX_FILE_BYTES} accepted")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise HandoffError(NOT_UTF8, f"the file is not UTF-8: {exc}") from None
    try:
        obj = json.loads(text)
    except ValueError as exc:
        raise HandoffError(BAD_SHAPE, f"not JSON: {exc}") from None
    obj = _obj(obj, "(the file)")
    if obj.get("kind") != "task":
        raise _fail("kind", 'required, "task" (an A2A Task object)')
    tid = _ident(obj.get("id"), "id")
    thread = _ident(obj.get("contextId"), "contextId")
    status = _obj(obj.get("status"), "status")
    state = status.get("state")
    stamp = _when(status.get("timestamp"), "status.timestamp")
    meta = _obj(_obj(obj.get("metadata"), "metadata").get("fleet"), "metadata.fleet")
    if meta.get("schema_version") != SCHEMA_VERSION:
        raise _fail("metadata.fleet.schema_version", f"must be {SCHEMA_VERSION}, not "
                    f"{json.dumps(meta.get('schema_version'))[:40]}")
    kind = meta.get("type")
    if kind not in (HANDOFF, RESULT):
        raise _fail("metadata.fleet.type", 'required, "handoff" or "result"')
    m = "metadata.fleet."
    producer = _party(meta.get("producer"), m + "producer")
    consumer = _party(meta.get("consumer"), m + "consumer")
    if producer == consumer:
        raise _fail(m + "consumer", f"is the producer ({producer.agent} on {producer.host}): "
                    "an agent does not hand work to itself")
    root_task = _ident(meta.get("root_task"), m + "root_task")
    parent_task = _ident(meta.get("parent_task"), m + "parent_task")
    channel = meta.get("channel")
    if channel is not None:
        channel = _text(channel, m + "channel")
        if "\0" in channel:
            raise _fail(m + "channel", "holds a NUL character")
    hops = _count(meta.get("hops"), m + "hops")
    hop_budget = _count(meta.get("hop_budget"), m + "hop_budget")
    if kind == HANDOFF:
        if state != "submitted":
            raise _fail("status.state", f'a hand-off is "submitted", not '
                        f"{json.dumps(state)[:40]}")
        history = obj.get("history")
        if not isinstance(history, list) or len(history) != 1:
            raise _fail("history", "required, exactly one message: the brief")
        message = _obj(history[0], "history[0]")
        for key, want in (("kind", "message"), ("role", "user"),
                          ("messageId", f"{tid}#brief"), ("taskId", tid),
                          ("contextId", thread)):
            if message.get(key) != want:
                raise _fail(f"history[0].{key}", f"must be {json.dumps(want)}")
        brief = _one_text_part(message.get("parts"), "history[0].parts")
        if not brief:
            raise _fail("history[0].parts[0].text", "the brief is empty")
        if hops < 1:
            raise _fail(m + "hops", "a hand-off is at least hop 1")
        digest = meta.get("brief_sha256")
        if not isinstance(digest, str) or not _HEX64.fullmatch(digest):
            raise _fail(m + "brief_sha256", "required, 64 lower-case hex digits")
        if text_sha256(brief) != digest:
            raise HandoffError(DIGEST_MISMATCH, f"the brief's sha256 is {text_sha256(brief)}"
                               f", not the {digest} it was sent with: a byte changed on the "
                               "way")
        return Handoff(id=tid, thread=thread, brief=brief,
                       expected=_text(meta.get("expected"), m + "expected"),
                       deadline=_when(meta.get("deadline"), m + "deadline"),
                       producer=producer, consumer=consumer, root_task=root_task,
                       parent_task=parent_task, channel=channel, hops=hops,
                       hop_budget=hop_budget, submitted=stamp)
    if state not in RESULT_STATES:
        raise _fail("status.state", "a result is one of " + ", ".join(RESULT_STATES)
                    + f", not {json.dumps(state)[:40]}")
    artifacts = obj.get("artifacts")
    if not isinstance(artifacts, list) or len(artifacts) != 1:
        raise _fail("artifacts", "required, exactly one artifact: the result")
    artifact = _obj(artifacts[0], "artifacts[0]")
    if artifact.get("artifactId") != f"{tid}#result":
        raise _fail("artifacts[0].artifactId", f"must be {json.dumps(tid + '#result')}")
    summary = _one_text_part(artifact.get("parts"), "artifacts[0].parts")
    digest = meta.get("summary_sha256")
    if not isinstance(digest, str) or not _HEX64.fullmatch(digest):
        raise _fail(m + "summary_sha256", "required, 64 lower-case hex digits")
    if text_sha256(summary) != digest:
        raise HandoffError(DIGEST_MISMATCH, f"the summary's sha256 is {text_sha256(summary)}"
                           f", not the {digest} it was sent with: a byte changed on the way")
    files = meta.get("files")
    if not isinstance(files, list):
        raise _fail(m + "files", "required, a list of paths (may be empty)")
    for i, path in enumerate(files):
        _text(path, f"{m}files[{i}]")
    outcome = meta.get("outcome")
    if outcome is not None:
        outcome = _text(outcome, m + "outcome")
    return Result(id=tid, thread=thread, state=state, summary=summary, producer=producer,
                  consumer=consumer, root_task=root_task, parent_task=parent_task,
                  channel=channel, hops=hops, hop_budget=hop_budget, files=tuple(files),
                  outcome=outcome, timestamp=stamp)


def build_handoff(*, id: str, thread: str, brief: str, expected: str, deadline: str,
                  producer: Party, consumer: Party, root_task: str, parent_task: str,
                  channel: str | None, hops: int, hop_budget: int,
                  now: float | None = None) -> Handoff:
    """A hand-off, checked by the same rules a receiver applies.

    Raises:
        HandoffError: a field breaks a rule (the code and text a receiver would give).
    """
    made = Handoff(id=id, thread=thread, brief=brief, expected=expected, deadline=deadline,
                   producer=producer, consumer=consumer, root_task=root_task,
                   parent_task=parent_task, channel=channel, hops=hops, hop_budget=hop_budget,
                   submitted=utc_iso(now))
    parse_team_file(encode(made))
    return made


def build_result(handoff: Handoff, *, state: str, summary: str, files: tuple[str, ...] = (),
                 outcome: str | None = None, now: float | None = None) -> Result:
    """The result answering ``handoff``: from its consumer to its producer, same id, thread,
    root and parent task, channel and hops.

    Raises:
        HandoffError: a field breaks a rule (``state`` not one of :data:`RESULT_STATES`, a
            summary that is not valid UTF-8 ...).
    """
    made = Result(id=handoff.id, thread=handoff.thread, state=state, summary=summary,
                  producer=handoff.consumer, consumer=handoff.producer,
                  root_task=handoff.root_task, parent_task=handoff.parent_task,
                  channel=handoff.channel, hops=handoff.hops, hop_budget=handoff.hop_budget,
                  files=tuple(files), outcome=outcome, timestamp=utc_iso(now))
    parse_team_file(encode(made))
    return made


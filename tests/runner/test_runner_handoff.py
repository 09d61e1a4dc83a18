"""Hand-offs and results at the boundary (issue 20): the A2A-shaped file, `teamstate.receive`
(exactly once by id and digest, byte-exact, crash-safe drop) and the `dispatch` CLI feeding it.

The failures these tests pin were found elsewhere first:
- a redelivery after a lost acknowledgement processed twice (RabbitMQ/NATS at-least-once;
  AgentWorkforce/relay#1262, a stale ack matched a redelivered entry): here the retry is a
  `duplicate` and the inbox holds one file, also after the consumer finished the task;
- Celery's visibility timeout re-queued a task still running (celery/celery#5306): a
  redelivery while the consumer works on it is a duplicate, nothing new is queued;
- delivered but marked delivered only afterwards, so a crash in between replayed it
  (bastani-inc/atomic#2721): a receive killed between its record and its drop, or between the
  drop and the mark, is finished by the retry, never dropped twice;
- the same messageId with other input (xorbitsai/xagent#2501, A2A PR #939's idempotency
  rules): refused, the first kept; different ids with the same text are two tasks
  (microsoft/agent-framework#4716 dropped repeated "yes" messages that shared content).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

REPO = Path(__file__).resolve().parents[2]
RUNNER = REPO / "blueprint" / "runner"
sys.path.insert(0, str(RUNNER))

from fleet_runner import handoff as ho  # noqa: E402
from fleet_runner import teamstate as ts  # noqa: E402
from fleet_runner.inbox import MessageError, parse_message  # noqa: E402
from fleet_runner.names import encode_name  # noqa: E402
from fleet_runner.prompt import build_task_prompt  # noqa: E402
from fleet_runner.roster import RosterError, parse_roster  # noqa: E402
from tests.helpers import WAIT_S  # noqa: E402

DISPATCH = REPO / "blueprint" / "skills" / "dispatch" / "bin" / "dispatch"
TEAM = {"schema_version": 1, "host": "alpha",
        "agents": {"concierge": {"host": "alpha", "role": "concierge"},
                   "engineer": {"host": "alpha", "role": "engineer"},
                   "qa1": {"host": "alpha", "role": "qa"}, "qa2": {"host": "beta", "role": "qa"},
                   "reviewer": {"host": "beta", "role": "reviewer"}},
        "hosts": {"beta": {"relay": True}}}
ROSTER = parse_roster(TEAM)
HOSTILE = ("it's \"quoted\" $HOME `id` $(rm -rf /) \\n\r\nCRLF line\r\n\ttab ünïcödé 🚀 \u2028"
           "\x00nul -- --to x\n")


def _handoff(brief: str = "Fix the refund bug.", tid: str = "h-1", **over) -> ho.Handoff:
    fields = dict(id=tid, thread="slack:C1:1.2", brief=brief, expected="a PR link",
                  deadline="2099-01-01T00:00:00Z", producer=ho.Party("concierge", "alpha"),
                  consumer=ho.Party("engineer", "alpha"), root_task="slack:C1:1.2",
                  parent_task="slack:C1:1.2", channel="#support", hops=1, hop_budget=6)
    fields.update(over)
    return ho.build_handoff(**fields)


def _receive(tmp_path: Path, data: bytes, **kw) -> ts.Ack:
    return ts.receive(data, state_root=tmp_path / "state", host="alpha", roster=ROSTER, **kw)


def _inbox(tmp_path: Path, agent: str = "engineer") -> list[Path]:
    inbox = tmp_path / "state" / agent / "inbox"
    return sorted(p for p in inbox.iterdir() if not p.name.startswith(".")) if inbox.is_dir() \
        else []


# -- the shape ---------------------------------------------------------------------------------

def test_a_handoff_is_an_a2a_task_and_parses_back_to_itself():
    made = _handoff(HOSTILE.replace("\x00", ""))
    data = ho.encode(made)
    wire = json.loads(data)
    # The A2A v0.3.0 Task fields, checked against the spec's names, not the builder's.
    assert wire["kind"] == "task" and wire["id"] == "h-1" and wire["contextId"] == "slack:C1:1.2"
    assert wire["status"]["state"] == "submitted"
    [message] = wire["history"]
    assert (message["kind"], message["role"], message["messageId"], message["taskId"]) == (
        "message", "user", "h-1#brief", "h-1")
    assert message["parts"] == [{"kind": "text", "text": made.brief}]
    fleet = wire["metadata"]["fleet"]
    assert fleet["brief_sha256"] == __import__("hashlib").sha256(
        made.brief.encode()).hexdigest()
    assert data.endswith(b"\n") and data.count(b"\n") == 1 and data.isascii()
    assert ho.parse_team_file(data) == made
    assert ho.file_digest(data) == "sha256:" + __import__("hashlib").sha256(data).hexdigest()


def test_a_result_answers_with_the_same_id_from_the_consumer_to_the_producer():
    made = ho.build_result(_handoff(), state="completed", summary="PR #7\r\nmerged",
                           files=("a.py",), outcome="passed")
    wire = json.loads(ho.encode(made))
    assert wire["id"] == "h-1" and wire["status"]["state"] == "completed"
    assert wire["artifacts"] == [{"artifactId": "h-1#result",
                                  "parts": [{"kind": "text", "text": "PR #7\r\nmerged"}]}]
    fleet = wire["metadata"]["fleet"]
    assert fleet["producer"] == {"agent": "engineer", "host": "alpha"}
    assert fleet["consumer"] == {"agent": "concierge", "host": "alpha"}
    assert ho.parse_team_file(ho.encode(made)) == made


def _mutated(path: list, value=None, delete: bool = False) -> bytes:
    wire = _handoff().to_wire()
    node = wire
    for key in path[:-1]:
        node = node[key]
    if delete:
        del node[path[-1]]
    else:
        node[path[-1]] = value
    return json.dumps(wire).encode()


@pytest.mark.parametrize("data, code, names", [
    (b"\xff\xfe not utf-8", "not-utf8", "not UTF-8"),
    (b"[1, 2]", "bad-shape", "JSON object"),
    (_mutated(["id"], delete=True), "bad-shape", "id: required"),
    (_mutated(["id"], ""), "bad-shape", "it is empty"),
    (_mutated(["id"], "t1\n"), "bad-shape", "id: required"),
    (_mutated(["contextId"], None), "bad-shape", "contextId"),
    (_mutated(["status", "state"], "working"), "bad-shape", "status.state"),
    (_mutated(["history"], []), "bad-shape", "history"),
    (_mutated(["history", 0, "parts", 0, "kind"], "file"), "bad-shape", "only text parts"),
    (_mutated(["history", 0, "parts", 0, "text"], "Fix the refund bug!"), "digest-mismatch",
     "a byte changed"),
    (_mutated(["history", 0, "parts", 0, "text"], "\ud800"), "not-utf8", "lone surrogate"),
    (_mutated(["metadata", "fleet", "consumer"], {"agent": "", "host": "alpha"}), "bad-shape",
     "metadata.fleet.consumer.agent"),
    (_mutated(["metadata", "fleet", "consumer"], {"agent": "concierge", "host": "alpha"}),
     "bad-shape", "does not hand work to itself"),
    (_mutated(["metadata", "fleet", "hops"], True), "bad-shape", "metadata.fleet.hops"),
    (_mutated(["metadata", "fleet", "deadline"], "tomorrow"), "bad-shape", "deadline"),
    (_mutated(["metadata", "fleet", "schema_version"], 2), "bad-shape", "schema_version"),
    (_mutated(["metadata", "fleet", "type"], "note"), "bad-shape", "metadata.fleet.type"),
])
def test_a_malformed_file_is_refused_with_its_code_and_the_key(data, code, names):
    with pytest.raises(ho.HandoffError) as info:
        ho.parse_team_file(data)
    assert info.value.code == code and names in info.value.text, info.value.text


def test_deadlines_are_spans_or_utc_times():
    assert ho.parse_deadline("2h", now=0) == "1970-01-01T02:00:00Z"
    assert ho.parse_deadline("90s", now=0) == "1970-01-01T00:01:30Z"
    assert ho.parse_deadline("2099-01-01T00:00:00Z") == "2099-01-01T00:00:00Z"
    for bad in ("2 hours", "2026-02-30T00:00:00Z", "2000-01-01T00:00:00Z", "0h", "2h "):
        with pytest.raises(ValueError):
            ho.parse_deadline(bad)


# -- the roster --------------------------------------------------------------------------------

def test_to_resolves_an_agent_then_a_role_and_refuses_an_ambiguous_role():
    assert ROSTER.resolve("engineer").name == "engineer"
    assert ROSTER.resolve("reviewer").host == "beta"
    with pytest.raises(RosterError, match=r"held by 2 agents \(qa1, qa2\)"):
        ROSTER.resolve("qa")
    with pytest.raises(RosterError, match="no agent or role of that name.*concierge"):
        ROSTER.resolve("nobody")
    with pytest.raises(RosterError, match="agents.x.host"):
        parse_roster({**TEAM, "agents": {"x": {"role": "qa"}}})


# -- receive: exactly once ---------------------------------------------------------------------

def test_a_retry_after_a_lost_ack_is_a_duplicate_and_the_task_arrives_once(tmp_path):
    data = ho.encode(_handoff())
    first = _receive(tmp_path, data)
    assert (first.status, first.id, first.digest) == ("accepted", "h-1", ho.file_digest(data))
    [dropped] = _inbox(tmp_path)
    assert dropped.name == "handoff-h-1.json" and dropped.read_bytes() == data
    # The ack was lost: the sender retries, while the consumer works on it and after it is done.
    again = _receive(tmp_path, data)
    assert again.status == "duplicate" and again.ok
    assert _inbox(tmp_path) == [dropped]
    done = tmp_path / "state" / "engineer" / "done"
    done.mkdir()
    os.rename(dropped, done / dropped.name)
    assert _receive(tmp_path, data).status == "duplicate"
    assert _inbox(tmp_path) == []
    record = json.loads((tmp_path / "state/engineer/team/received/h-1.json").read_text())
    assert record["digest"] == ho.file_digest(data) and record["delivered"] is True
    assert record["type"] == "handoff" and record["from"] == "concierge@alpha"
    assert (tmp_path / "state/engineer/team/received/h-1.bytes").read_bytes() == data


def test_an_id_reused_with_other_content_is_refused_and_the_first_kept(tmp_path):
    first = ho.encode(_handoff("Fix the refund bug."))
    other = ho.encode(_handoff("Delete the database."))
    assert _receive(tmp_path, first).status == "accepted"
    ack = _receive(tmp_path, other)
    assert (ack.status, ack.code, ack.id) == ("refused", "id-reused", "h-1")
    assert "the first is kept" in ack.reason and ack.digest == ho.file_digest(other)
    [kept] = _inbox(tmp_path)
    assert kept.read_bytes() == first
    assert (tmp_path / "state/engineer/team/received/h-1.bytes").read_bytes() == first


def test_the_same_text_under_two_ids_is_two_tasks(tmp_path):
    for tid in ("h-1", "h-2"):
        assert _receive(tmp_path, ho.encode(_handoff("yes", tid=tid))).status == "accepted"
    texts = [parse_message(p.read_bytes()).text for p in _inbox(tmp_path)]
    assert [p.name for p in _inbox(tmp_path)] == ["handoff-h-1.json", "handoff-h-2.json"]
    assert texts == ["yes", "yes"]


def test_a_changed_byte_is_refused_and_nothing_is_recorded(tmp_path):
    data = ho.encode(_handoff("refund 100 EUR"))
    tampered = data.replace(b"100", b"900")
    ack = _receive(tmp_path, tampered)
    assert (ack.status, ack.code) == ("refused", "digest-mismatch")
    assert ack.digest == ho.file_digest(tampered) != ho.file_digest(data)
    assert _inbox(tmp_path) == [] and not (tmp_path / "state/engineer/team/received").exists()
    # The true bytes still go through afterwards: a refusal leaves no record behind.
    assert _receive(tmp_path, data).status == "accepted"


@pytest.mark.parametrize("over, kw, code, says", [
    ({"consumer": ho.Party("ghost", "alpha")}, {}, "unknown-consumer", "not an agent"),
    ({"consumer": ho.Party("reviewer", "beta")}, {}, "unknown-consumer", "runs on beta"),
    ({}, {"agent": "qa1"}, "unknown-consumer", "handed to qa1"),
    ({"producer": ho.Party("mallory", "alpha")}, {}, "bad-shape", "not an agent of the fleet"),
    ({"producer": ho.Party("reviewer", "beta")}, {"sender_host": "gamma"}, "bad-shape",
     "through the relay of host gamma"),
    ({"hops": 7, "hop_budget": 6}, {}, "hop-budget", "hop 7 of root task slack:C1:1.2"),
])
def test_the_roster_and_the_hop_budget_refuse_at_the_boundary(tmp_path, over, kw, code, says):
    ack = _receive(tmp_path, ho.encode(_handoff(**over)), **kw)
    assert (ack.status, ack.code) == ("refused", code) and says in ack.reason, ack.reason
    assert not (tmp_path / "state").exists() or not any((tmp_path / "state").rglob("*.json"))


def test_a_handoff_through_the_relay_from_its_producers_host_is_taken(tmp_path):
    data = ho.encode(_handoff(producer=ho.Party("reviewer", "beta")))
    assert _receive(tmp_path, data, sender_host="beta").status == "accepted"
    record = json.loads((tmp_path / "state/engineer/team/received/h-1.json").read_text())
    assert record["via"] == "relay"


_CRASH = """
import os, sys
sys.path.insert(0, {runner!r})
from fleet_runner import teamstate
from fleet_runner.roster import parse_roster
point = {point!r}
real_rename, real_write = os.rename, teamstate.write_json_atomic
def rename(src, dst):
    if point == "before-drop" and "/inbox/" in str(dst):
        os._exit(9)  # killed after the record, before the drop
    real_rename(src, dst)
def write(path, data):
    if point == "before-mark" and data.get("delivered") is True:
        os._exit(9)  # killed after the drop, before the record says so
    real_write(path, data)
teamstate.os.rename, teamstate.write_json_atomic = rename, write
teamstate.receive(sys.stdin.buffer.read(), state_root={state!r}, host="alpha",
                  roster=parse_roster({team!r}))
"""


@pytest.mark.parametrize("point", ["before-drop", "before-mark"])
def test_a_receive_killed_between_record_and_drop_is_finished_by_the_retry(tmp_path, point):
    data = ho.encode(_handoff(HOSTILE))
    code = _CRASH.format(runner=str(RUNNER), point=point, state=str(tmp_path / "state"),
                         team=TEAM)
    done = subprocess.run([sys.executable, "-c", code], input=data, capture_output=True,
                          timeout=WAIT_S, env={**os.environ, "PYTHONDONTWRITEBYTECODE": "1"})
    assert done.returncode == 9, done.stderr.decode()
    record_path = tmp_path / "state/engineer/team/received/h-1.json"
    assert json.loads(record_path.read_text())["delivered"] is False  # killed where meant
    dropped_before = len(_inbox(tmp_path))
    assert dropped_before == (0 if point == "before-drop" else 1)
    ack = _receive(tmp_path, data)
    assert ack.status == "duplicate"
    [dropped] = _inbox(tmp_path)
    assert dropped.read_bytes() == data
    assert json.loads(record_path.read_text())["delivered"] is True
    assert not [p for p in (tmp_path / "state/engineer/inbox").iterdir()
                if p.name.startswith(".")]  # no staged file left over
    assert _receive(tmp_path, data).status == "duplicate" and len(_inbox(tmp_path)) == 1


def test_a_result_is_dropped_for_the_producer_and_recorded_in_its_sent_records(tmp_path):
    handoff = _handoff()
    state = tmp_path / "state" / "concierge"
    ts.record_sent(state, handoff, ho.encode(handoff))
    result = ho.build_result(handoff, state="completed", summary="PR #7", files=("a.py",))
    ack = _receive(tmp_path, ho.encode(result))
    assert ack.status == "accepted"
    [dropped] = _inbox(tmp_path, "concierge")
    assert dropped.name == "result-h-1.json"
    message = parse_message(dropped.read_bytes())
    assert (message.id, message.sender_name, message.text) == ("h-1", "engineer", "PR #7")
    sent = json.loads((state / "team/sent/h-1.json").read_text())
    assert sent["state"] == "answered" and sent["result"]["summary"] == "PR #7"
    assert sent["result"]["state"] == "completed" and ts.overdue(state, now=4e9) == []


def test_sent_records_track_tries_refusals_and_deadlines(tmp_path):
    state = tmp_path / "state" / "concierge"
    handoff = _handoff(deadline="2030-01-01T00:00:00Z")
    data = ho.encode(handoff)
    record = ts.record_sent(state, handoff, data)
    assert record["state"] == "pending" and record["digest"] == ho.file_digest(data)
    path = ts.sent_dir(state) / "h-1.json"
    ts.mark_delivery(path, error="connection reset")
    [(p, rec, sent_bytes)] = ts.pending(ts.sent_dir(state))
    assert rec["tries"] == 1 and rec["last_error"] == "connection reset" and sent_bytes == data
    # A retried attempt builds it again (another timestamp): the first bytes stay the ones sent.
    again = _handoff(deadline="2030-01-01T00:00:00Z")
    assert ts.record_sent(state, again, ho.encode(again))["digest"] == ho.file_digest(data)
    with pytest.raises(ho.HandoffError, match="already sent as another hand-off"):
        other = _handoff("something else")
        ts.record_sent(state, other, ho.encode(other))
    ts.mark_delivery(path, ack=ts.Ack("accepted", None, None, ho.file_digest(data), "h-1"))
    assert ts.pending(ts.sent_dir(state)) == []
    assert [r["id"] for _, r in ts.overdue(state, now=ho.parse_when("2030-01-01T00:00:01Z"))] \
        == ["h-1"]
    assert ts.overdue(state, now=ho.parse_when("2029-12-31T23:59:59Z")) == []
    ts.mark_escalated(path)
    assert ts.overdue(state, now=4e9) == []  # escalated once, never again


def test_an_ack_survives_its_wire_line():
    ack = ts.Ack("refused", "id-reused", "the first is kept\nsecond line", "sha256:00", "h-1")
    line = ack.to_line()
    assert "\n" not in line and ts.Ack.from_line(line) == ack
    with pytest.raises(ValueError):
        ts.Ack.from_line('{"status": "maybe"}')


# -- dispatch -> file -> receive -> inbox -> the runner's message ------------------------------

def _dispatch(tmp_path: Path, *args: str, brief: bytes | None = None, stdin: bytes | None = None,
              context: dict | None = None) -> subprocess.CompletedProcess:
    (tmp_path / "team.json").write_text(json.dumps(TEAM))
    ctx = {"task": "slack:C1:1.2", "root_task": "slack:C1:1.2", "thread": "slack:C1:1.2",
           "channel": "#support", "hops": 0, "hop_budget": 6, "agent": "concierge",
           "host": "alpha", **(context or {})}
    (tmp_path / "context.json").write_text(json.dumps(ctx))
    argv = [str(DISPATCH), "--to", "engineer", "--expect", "a PR link", *args]
    if brief is not None:
        (tmp_path / "brief.bin").write_bytes(brief)
        argv += ["--brief-file", str(tmp_path / "brief.bin")]
    if stdin is not None:
        argv += ["--brief-stdin"]
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLEET_")}
    env.update(FLEET_ROSTER=str(tmp_path / "team.json"), FLEET_HANDOFFS=str(tmp_path / "out"),
               FLEET_TASK_CONTEXT=str(tmp_path / "context.json"), PYTHONDONTWRITEBYTECODE="1")
    return subprocess.run(argv, input=stdin, capture_output=True, env=env, timeout=WAIT_S)


def _through(tmp_path: Path, brief: bytes, via_stdin: bool = False) -> str:
    done = _dispatch(tmp_path, brief=None if via_stdin else brief,
                     stdin=brief if via_stdin else None)
    assert done.returncode == 0, done.stderr.decode()
    tid = done.stdout.decode().strip()
    data = (tmp_path / "out" / f"handoff-{encode_name(tid)}.json").read_bytes()
    assert _receive(tmp_path, data).status == "accepted"
    [dropped] = [p for p in _inbox(tmp_path) if encode_name(tid) in p.name]
    return parse_message(dropped.read_bytes()).text


@settings(max_examples=25, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.text(min_size=1, max_size=400))
@example(HOSTILE)
@example("\r\n")
@example("\ufeffBOM first")
@example("--help")
def test_any_brief_arrives_byte_identical(tmp_path_factory, text):
    tmp_path = tmp_path_factory.mktemp("brief")
    encoded = text.encode("utf-8", "surrogatepass")
    if any(0xD800 <= ord(c) <= 0xDFFF for c in text):  # not UTF-8: refused, below
        return
    assert _through(tmp_path, encoded).encode("utf-8") == encoded


def test_a_500kb_brief_through_stdin_arrives_byte_identical(tmp_path):
    brief = (HOSTILE * (500_000 // len(HOSTILE) + 1)).encode()[:500_000]
    brief = brief.decode("utf-8", "ignore").encode()
    assert _through(tmp_path, brief, via_stdin=True).encode() == brief


def test_a_brief_that_is_not_utf8_is_refused_before_anything_is_written(tmp_path):
    done = _dispatch(tmp_path, brief=b"caf\xe9 latin-1")
    assert done.returncode == 2 and b"not valid UTF-8 (byte 3" in done.stderr
    assert not (tmp_path / "out").exists()


def test_the_same_brief_again_reuses_the_id_and_another_id_is_another_task(tmp_path):
    ids = [_dispatch(tmp_path, brief=b"same").stdout for _ in range(2)]
    assert ids[0] == ids[1] and ids[0].startswith(b"h-")
    other = _dispatch(tmp_path, "--id", "h-second", brief=b"same")
    assert other.returncode == 0 and other.stdout == b"h-second\n"
    assert len(list((tmp_path / "out").glob("handoff-*.json"))) == 2


def test_dispatch_help_and_refusals(tmp_path):
    helped = subprocess.run([str(DISPATCH), "--help"], capture_output=True, text=True,
                            timeout=WAIT_S)
    assert helped.returncode == 0
    for phrase in ("--brief-file", "--brief-stdin", "--expect", "--deadline", "Exit status",
                   "hop budget", "FLEET_HANDOFFS"):
        assert phrase in helped.stdout, phrase
    unknown = _dispatch(tmp_path, "--to", "ghost", brief=b"x")
    assert unknown.returncode == 2 and b"no agent or role of that name" in unknown.stderr
    ambiguous = _dispatch(tmp_path, "--to", "qa", brief=b"x")
    assert ambiguous.returncode == 2 and b"qa1, qa2" in ambiguous.stderr
    self_ = _dispatch(tmp_path, "--to", "concierge", brief=b"x")
    assert self_.returncode == 2 and b"that is you" in self_.stderr
    empty = _dispatch(tmp_path, brief=b"")
    assert empty.returncode == 2 and b"empty" in empty.stderr
    assert not (tmp_path / "out").exists()


def test_dispatch_at_the_hop_budget_is_refused_with_a_record_for_the_runner(tmp_path):
    done = _dispatch(tmp_path, brief=b"again", context={"hops": 6, "hop_budget": 6})
    assert done.returncode == 3 and b"hop 7 of root task slack:C1:1.2" in done.stderr
    [refusal] = (tmp_path / "out").glob("refusal-*.json")
    record = json.loads(refusal.read_text())
    assert (record["code"], record["hops"], record["hop_budget"], record["consumer"]) == (
        "hop-budget", 7, 6, "engineer")
    assert not list((tmp_path / "out").glob("handoff-*.json"))


def test_the_task_prompt_shows_the_brief_expected_deadline_and_producer(tmp_path):
    message = parse_message(ho.encode(_handoff("Fix `refunds` $NOW\r\n")))
    prompt = build_task_prompt(message, 1, 3)
    assert "agent concierge on host alpha: a hand-off" in prompt
    assert "Expected back: a PR link" in prompt and "Deadline: 2099-01-01T00:00:00Z" in prompt
    assert "Brief:\nFix `refunds` $NOW\r\n" in prompt and "hop 1 of 6" in prompt
    assert "reply CLI" not in prompt  # no anti-silence: an agent asked
    result = ho.build_result(_handoff(), state="failed", summary="could not", files=("x.py",))
    prompt = build_task_prompt(parse_message(ho.encode(result)), 1, 3)
    assert "the result of your hand-off h-1" in prompt and "State: failed" in prompt
    assert "Files it says it touched: x.py" in prompt and "Summary:\ncould not" in prompt
    with pytest.raises(MessageError, match="digest-mismatch"):
        parse_message(ho.encode(_handoff("abc")).replace(b"abc", b"abd"))

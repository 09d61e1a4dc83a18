"""Decoding the host program's output lines into typed events (no host involved)."""

from __future__ import annotations

import pytest

from fleetctl.errors import HostError, PermissionDenied, ShipRefused
from fleetctl.hostevents import (
    BadEvent,
    Done,
    EntryEvent,
    Hello,
    Other,
    Step,
    UnreadableEvent,
    WarningEvent,
    decode_event,
    error_from_event,
)
from fleetctl.manifest import Entry


def test_each_kind_of_event_gets_its_type_and_fields():
    assert decode_event(b'{"t":"hello","user":"deploy","group":"staff","uid":7}') == \
        Hello("hello", {"user": "deploy", "group": "staff", "uid": 7}, "deploy", "staff")
    entry = decode_event(b'{"t":"entry","path":"a/b","type":"file","mode":"0644",'
                         b'"owner":"u:g","size":3,"digest":"sha256:ab"}')
    assert isinstance(entry, EntryEvent) and entry.t == "entry"
    assert entry.entry == Entry("a/b", "file", "0644", "u:g", 3, "sha256:ab")
    shipped = decode_event(b'{"t":"shipped","path":"x","type":"dir","mode":"0755"}')
    assert isinstance(shipped, EntryEvent) and shipped.t == "shipped"
    assert decode_event(b'{"t":"unreadable","path":"x","error":"Permission denied"}') == \
        UnreadableEvent("unreadable", {"path": "x", "error": "Permission denied"}, "x",
                        "Permission denied")
    assert decode_event(b'{"t":"warning","message":"m"}') == \
        WarningEvent("warning", {"message": "m"}, "m")
    assert decode_event(b'{"t":"step","name":"verify"}') == \
        Step("step", {"name": "verify"}, "verify")
    done = decode_event(b'{"t":"done","release":"r2","pruned":["r0"]}')
    assert isinstance(done, Done) and (done.release, done.pruned) == ("r2", ("r0",))
    other = decode_event(b'{"t":"ledger","agent":"a","line":"{}"}')
    assert isinstance(other, Other) and other.as_dict() == {"t": "ledger", "agent": "a",
                                                            "line": "{}"}


@pytest.mark.parametrize("line", [
    b'{"t":"entry","path":"../etc/passwd","type":"file"}',
    b'{"t":"shipped","path":"/abs","type":"file"}',
    b'{"t":"unreadable","path":"a/../../b","error":"x"}',
    b'{"t":"entry","type":"file"}',
])
def test_a_path_that_is_not_plain_and_relative_is_refused(line):
    with pytest.raises(BadEvent, match="not a plain relative path"):
        decode_event(line)


@pytest.mark.parametrize("line", [b"Traceback (most recent call last):", b"[1, 2]",
                                  b'{"no_t": 1}', b'{"t":"step","name":3}'])
def test_what_is_not_an_event_is_refused(line):
    with pytest.raises(BadEvent):
        decode_event(line)


def test_an_error_event_becomes_the_exception_of_its_kind():
    error = decode_event(b'{"t":"error","step":"lock","kind":"locked","message":"held",'
                         b'"path":null}')
    assert error == {"step": "lock", "kind": "locked", "message": "held", "path": None}
    assert isinstance(error, dict)
    refused = error_from_event("web1", error)
    assert isinstance(refused, ShipRefused) and str(refused) == "web1: lock: held"
    denied = error_from_event("web1", {"step": "assemble", "kind": "permission",
                                       "message": "EACCES", "path": "/srv/x"})
    assert isinstance(denied, PermissionDenied)
    assert str(denied) == "web1: assemble: EACCES (/srv/x); stopped, nothing was retried"
    failed = error_from_event("web1", {"step": "scan", "kind": "layout", "message": "m"})
    assert type(failed) is HostError and failed.hint is None

"""A local stand-in for the Anthropic Messages API, so a harness can be probed offline.

``fleetctl tokens --probe`` starts the role's real agent command (``claude -p``) with
``ANTHROPIC_BASE_URL`` pointing here and a made-up key. This server answers just enough of the
API for the harness to finish one turn, and records every request it receives:

- ``POST /v1/messages``: a one-block text answer (``ok``), ``stop_reason: end_turn``, with
  ``usage``; as Server-Sent Events when the request says ``"stream": true`` (the event sequence
  the API documents: ``message_start``, ``content_block_start``, ``content_block_delta``,
  ``content_block_stop``, ``message_delta``, ``message_stop``), else as one JSON object;
- ``POST /v1/messages/count_tokens``: ``{"input_tokens": 1}``: a harness only uses it for its
  own bookkeeping; nothing here relies on it (the probe counts the request itself);
- anything else: ``404`` with an API-shaped error object (``HEAD``/``GET /`` connectivity checks
  included).

It listens on ``127.0.0.1`` only, on a free port. Recorded requests keep the path, the JSON body
and the request headers minus credentials (``x-api-key``, ``authorization`` are dropped): they
stay in memory and are never written anywhere by this module (the captured text is the harness
vendor's; only counts and digests leave the probe, :mod:`fleetctl.tokens.harness`).
"""

from __future__ import annotations

import json
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

ANSWER_TEXT = "ok"
"""What every ``/v1/messages`` answer says."""

_SECRET_HEADERS = {"x-api-key", "authorization", "proxy-authorization", "cookie"}


@dataclass(frozen=True, slots=True)
class Recorded:
    """One request the endpoint received.

    Attributes:
        method: ``POST``, ``GET``...
        path: the path with its query (``/v1/messages?beta=true``).
        headers: request headers, lower-cased names, credentials left out.
        body: the JSON body, or ``None`` (no body, or not JSON).
        time_s: ``time.monotonic()`` when it arrived.
    """

    method: str
    path: str
    headers: dict[str, str]
    body: Any
    time_s: float

    @property
    def route(self) -> str:
        """The path without its query."""
        return self.path.split("?", 1)[0]


@dataclass
class _State:
    requests: list[Recorded] = field(default_factory=list)
    cond: threading.Condition = field(default_factory=threading.Condition)


def _sse(events: list[tuple[str, dict[str, Any]]]) -> bytes:
    return "".join(f"event: {name}\ndata: {json.dumps(data)}\n\n"
                   for name, data in events).encode("utf-8")


def _message(model: str, input_tokens: int) -> dict[str, Any]:
    return {"id": "msg_fleetctl_probe", "type": "message", "role": "assistant", "model": model,
            "content": [{"type": "text", "text": ANSWER_TEXT}], "stop_reason": "end_turn",
            "stop_sequence": None,
            "usage": {"input_tokens": input_tokens, "output_tokens": 1,
                      "cache_creation_input_tokens": 0, "cache_read_input_tokens": 0}}


def _events(message: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    start = dict(message, content=[], stop_reason=None,
                 usage=dict(message["usage"], output_tokens=0))
    return [("message_start", {"type": "message_start", "message": start}),
            ("content_block_start", {"type": "content_block_start", "index": 0,
                                     "content_block": {"type": "text", "text": ""}}),
            ("content_block_delta", {"type": "content_block_delta", "index": 0,
                                     "delta": {"type": "text_delta", "text": ANSWER_TEXT}}),
            ("content_block_stop", {"type": "content_block_stop", "index": 0}),
            ("message_delta", {"type": "message_delta",
                               "delta": {"stop_reason": "end_turn", "stop_sequence": None},
                               "usage": {"output_tokens": 1}}),
            ("message_stop", {"type": "message_stop"})]


def _handler(state: _State) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - stdlib name
            pass

        def _record(self, body: bytes) -> Any:
            try:
                parsed = json.loads(body) if body else None
            except ValueError:
                parsed = None
            headers = {k.lower(): v for k, v in self.headers.items()
                       if k.lower() not in _SECRET_HEADERS}
            with state.cond:
                state.requests.append(Recorded(self.command, self.path, headers, parsed,
                                               time.monotonic()))
                state.cond.notify_all()
            return parsed

        def _send(self, status: int, body: bytes, content_type: str) -> None:
            self.send_response(status)
            self.send_header("content-type", content_type)
            self.send_header("content-length", str(len(body)))
            self.send_header("request-id", "req_fleetctl_probe")
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(body)

        def _not_found(self) -> None:
            error = {"type": "error", "error": {"type": "not_found_error",
                                               "message": f"{self.path}: not served by the "
                                                          "fleetctl probe endpoint"}}
            self._send(404, json.dumps(error).encode(), "application/json")

        def do_GET(self) -> None:  # noqa: N802 - stdlib name
            self._record(b"")
            self._not_found()

        do_HEAD = do_GET  # noqa: N815 - stdlib name

        def do_POST(self) -> None:  # noqa: N802 - stdlib name
            length = int(self.headers.get("content-length") or 0)
            raw = self.rfile.read(length) if length else b""
            body = self._record(raw)
            route = self.path.split("?", 1)[0].rstrip("/")
            if route.endswith("/v1/messages/count_tokens"):
                answer = {"input_tokens": 1}  # nothing here relies on it
                self._send(200, json.dumps(answer).encode(), "application/json")
            elif route.endswith("/v1/messages") and isinstance(body, dict):
                message = _message(str(body.get("model") or "unknown"), 1)
                if body.get("stream"):
                    self._send(200, _sse(_events(message)), "text/event-stream")
                else:
                    self._send(200, json.dumps(message).encode(), "application/json")
            else:
                self._not_found()

    return Handler


class ProbeEndpoint:
    """The local Messages API stand-in, as a context manager::

        with ProbeEndpoint() as endpoint:
            env["ANTHROPIC_BASE_URL"] = endpoint.base_url
            ...
            first = endpoint.wait_for_message(timeout_s=30)

    Attributes:
        base_url: ``http://127.0.0.1:PORT`` (no trailing slash), valid inside the ``with``.
    """

    def __init__(self) -> None:
        self._state = _State()
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None
        self.base_url = ""

    def __enter__(self) -> ProbeEndpoint:
        server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(self._state))
        server.daemon_threads = True
        self._server = server
        self.base_url = f"http://127.0.0.1:{server.server_address[1]}"
        self._thread = threading.Thread(target=server.serve_forever, name="probe-endpoint",
                                        daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)

    @property
    def requests(self) -> list[Recorded]:
        """Every request received so far, in arrival order (a copy)."""
        with self._state.cond:
            return list(self._state.requests)

    def messages(self) -> list[Recorded]:
        """The ``POST .../v1/messages`` requests (not ``count_tokens``) with a JSON body."""
        return [r for r in self.requests if r.method == "POST" and r.route.rstrip("/")
                .endswith("/v1/messages") and isinstance(r.body, dict)]

    def wait_for_message(self, timeout_s: float) -> Recorded | None:
        """The first ``/v1/messages`` request, waiting up to ``timeout_s`` seconds for it;
        ``None`` when none came."""
        deadline = time.monotonic() + timeout_s
        with self._state.cond:
            while True:
                found = self.messages()
                if found:
                    return found[0]
                left = deadline - time.monotonic()
                if left <= 0:
                    return None
                self._state.cond.wait(left)

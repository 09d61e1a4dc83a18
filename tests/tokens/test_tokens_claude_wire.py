"""`fleetctl tokens --counter claude-api` through the real ``anthropic`` SDK, over HTTP.

The language model's API is the one thing tests may fake: a local HTTP server answers
``POST /v1/messages/count_tokens`` with a count it derives from the request body by a fixed rule.
The SDK, its request encoding, fleetctl's delta arithmetic and the on-disk cache are all real.
"""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from tests.mcp_servers.project import make_tokens_project
from tests.tokens.test_tokens_cli import PROMPT, tokens

anthropic = pytest.importorskip("anthropic")

API_KEY = "sk-ant-test-" + "7f3c" * 8


def fake_count(body: dict) -> int:
    """The fake endpoint's rule: one token per 3 bytes of the canonical system + tools + messages."""
    parts = {k: body.get(k) for k in ("system", "tools", "messages")}
    return len(json.dumps(parts, sort_keys=True, separators=(",", ":")).encode()) // 3


class CountTokens(BaseHTTPRequestHandler):
    requests: list[dict] = []
    headers_seen: list[dict] = []

    def do_POST(self) -> None:  # noqa: N802 - http.server's name
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        type(self).requests.append(body)
        type(self).headers_seen.append({k.lower(): v for k, v in self.headers.items()})
        if self.path != "/v1/messages/count_tokens":
            self.send_response(404)
            self.end_headers()
            return
        data = json.dumps({"input_tokens": fake_count(body)}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args) -> None:
        pass


@pytest.fixture
def endpoint(monkeypatch, tmp_path):
    CountTokens.requests, CountTokens.headers_seen = [], []
    server = ThreadingHTTPServer(("127.0.0.1", 0), CountTokens)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    monkeypatch.setenv("ANTHROPIC_API_KEY", API_KEY)
    monkeypatch.setenv("ANTHROPIC_BASE_URL", f"http://127.0.0.1:{server.server_address[1]}")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    yield CountTokens
    server.shutdown()


def test_claude_counts_go_through_the_sdk_as_deltas_and_are_cached(tmp_path, endpoint):
    project = make_tokens_project(tmp_path, {"triager": {"prompt": PROMPT, "skills": ["reply"],
                                                         "model": "claude-sonnet-4-5"}})
    run = tokens("--counter", "claude-api", "--format", "json", project=project)
    assert run.code == 0, run.stdout + run.stderr
    sent = list(endpoint.requests)
    assert sent and all(r["model"] == "claude-sonnet-4-5" for r in sent)
    # The key went in the SDK's header, and nowhere in what fleetctl printed.
    assert all(API_KEY in (h.get("x-api-key"), h.get("authorization", "").removeprefix("Bearer "))
               for h in endpoint.headers_seen)  # SDK versions differ on which header
    assert API_KEY not in run.stdout + run.stderr
    # Every count is a delta against the bare request (the probe message alone), so the fixed
    # parts of a request are never counted into the prefix.
    bare = [r for r in sent if "system" not in r and "tools" not in r]
    assert len(bare) == 1
    full = max(sent, key=fake_count)
    agent = run.doc["agents"][0]
    assert agent["total_tokens"] == fake_count(full) - fake_count(bare[0])
    assert run.doc["counter"]["name"] == "claude-count-tokens"
    # A second run is answered from the cache file: nothing more is sent.
    again = tokens("--counter", "claude-api", "--format", "json", project=project)
    assert again.code == 0 and len(endpoint.requests) == len(sent)
    assert again.doc["agents"][0]["total_tokens"] == agent["total_tokens"]
    cache = tmp_path / "cache" / "fleetctl" / "claude-count-tokens.json"
    assert API_KEY not in cache.read_text()

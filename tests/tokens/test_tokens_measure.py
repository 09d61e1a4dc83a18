"""The prefix builder's tool components and their measurement: exact counts of hand-built
texts, marginal tool costs, the tool-use prompt table, and Claude's delta method with a scripted
stand-in for the count_tokens endpoint."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from fleetctl.tokencount.counters import ClaudeCountTokens, O200kCounter, request_digest
from fleetctl.tokencount.prefixmodule import load_prefix_module
from fleetctl.tokens.measure import ORDER, measure_claude, measure_offline

REPO = Path(__file__).resolve().parents[2]
P = load_prefix_module(REPO / "blueprint")

CREATE = {"name": "create_issue", "title": "Create issue", "description": "Create an issue.",
          "inputSchema": {"type": "object", "properties": {"title": {"type": "string"}},
                          "required": ["title"]},
          "annotations": {"readOnlyHint": False}, "outputSchema": {"type": "object"}}
SEARCH = {"name": "search_issues", "description": "Search issues by text.",
          "inputSchema": {"type": "object", "properties": {"query": {"type": "string"},
                                                           "limit": {"type": "integer"}}}}


def _skills(tmp_path: Path) -> Path:
    (tmp_path / "reply" / "bin").mkdir(parents=True)
    (tmp_path / "reply" / "SKILL.md").write_text("---\nsummary: Send the answer.\n---\nbody\n")
    (tmp_path / "reply" / "bin" / "reply").write_text("#!/bin/sh\n")
    return tmp_path


def _prefix(tmp_path: Path, **kw):
    return P.build_prefix("You are QA.\n", ["reply"], _skills(tmp_path), shell_tool=P.SHELL_TOOL,
                          mcp_servers=[P.McpServerTools("tracker", [CREATE, SEARCH],
                                                        "Search before you create.")], **kw)


def _compact(obj) -> str:
    return json.dumps(obj, ensure_ascii=False, separators=(",", ":"))


def test_runner_call_is_unchanged(tmp_path):
    prefix = P.build_prefix("You are QA.", ["reply"], _skills(tmp_path))
    assert list(prefix.components) == ["role_prompt", "skills_index", "cli_index"]
    assert prefix.tools == () and prefix.tool_use is None and prefix.instructions == ()
    assert prefix.text == "\n\n".join(prefix.components.values())


def test_mcp_tools_as_the_model_receives_them(tmp_path):
    prefix = _prefix(tmp_path)
    assert [t.name for t in prefix.tools] == ["bash", "mcp__tracker__create_issue",
                                              "mcp__tracker__search_issues"]
    sent = prefix.sent_tools()
    assert sent[1] == {"name": "mcp__tracker__create_issue", "description": "Create an issue.",
                       "input_schema": CREATE["inputSchema"]}
    assert prefix.tools[1].mcp_only == {"title": "Create issue", "annotations": {"readOnlyHint":
                                        False}, "outputSchema": {"type": "object"}}
    assert prefix.text == "\n\n".join(prefix.components.values())  # the runner's text only
    assert prefix.system_text() == prefix.text + ("\n\nMCP server instructions:\n\n## tracker\n"
                                                  "Search before you create.")


def test_offline_counts_are_the_tokenizer_on_the_exact_bytes(tmp_path):
    import tiktoken  # noqa: F401 - the encoder below is built independently of fleetctl's

    from fleetctl.tokencount.offline import load_o200k

    enc, _ = load_o200k()

    def n(text: str) -> int:
        return len(enc.encode_ordinary(text))

    prefix = _prefix(tmp_path)
    m = measure_offline(prefix, O200kCounter(), P)
    # Each component built by hand, byte for byte.
    role = "You are QA."
    skills = "Skills you can use:\n- reply: Send the answer."
    clis = ("CLIs on your PATH (run the command shown for usage before first use):\n"
            "- reply (skill reply): `reply --help`")
    instructions = "MCP server instructions:\n\n## tracker\nSearch before you create."
    shell = _compact({"name": "bash", "description": P.SHELL_TOOL["description"],
                      "input_schema": P.SHELL_TOOL["input_schema"]})
    create = _compact({"name": "mcp__tracker__create_issue", "description": "Create an issue.",
                       "input_schema": CREATE["inputSchema"]})
    search = _compact({"name": "mcp__tracker__search_issues",
                       "description": "Search issues by text.",
                       "input_schema": SEARCH["inputSchema"]})
    got = {c.name: c.tokens for c in m.components}
    assert got["role_prompt"] == n(role)
    assert got["skills_index"] == n(skills)
    assert got["cli_index"] == n(clis)
    assert got["mcp_instructions"] == n(instructions)
    assert got["shell_tool"] == n(shell)
    assert got["mcp_tools"] == n(create + "," + search)
    assert got["tool_use_system_prompt"] == 346  # Claude 4.x default, tool_choice auto
    system = "\n\n".join([role, skills, clis, instructions])
    total = n(system) + n("[" + ",".join([shell, create, search]) + "]") + 346
    assert m.total_tokens == total
    assert sum(got.values()) == total  # joins make the rows add up
    assert [c.name for c in m.components] == list(ORDER)
    # Marginal: the prefix without that one tool.
    marginal = {t.name: t.marginal_tokens for t in m.tools}
    assert marginal["mcp__tracker__create_issue"] == total - (
        n(system) + n("[" + shell + "," + search + "]") + 346)
    assert marginal["bash"] == total - (n(system) + n("[" + create + "," + search + "]") + 346)
    # MCP-only fields are sized apart and are in no total.
    create_cost = next(t for t in m.tools if t.name == "mcp__tracker__create_issue")
    assert create_cost.mcp_only_fields == ("annotations", "outputSchema", "title")
    assert create_cost.mcp_only_tokens == n(_compact(prefix.tools[1].mcp_only))
    # The Claude band is derived from the o200k count, the tabled prompt added as is.
    assert m.estimate == ((total - 346) * 110 // 100 + 346,
                          -(-(total - 346) * 140 // 100) + 346)


def test_the_only_tool_carries_the_fixed_prompt(tmp_path):
    prefix = P.build_prefix("p", ["reply"], _skills(tmp_path), shell_tool=P.SHELL_TOOL)
    m = measure_offline(prefix, O200kCounter(), P)
    shell = m.component("shell_tool").tokens
    assert m.tools[0].marginal_tokens == shell + 2 + 346  # the tool, its brackets, the prompt


@pytest.mark.parametrize("model, choice, tokens", [
    (None, "auto", 346), ("claude-sonnet-4-5-20250929", "auto", 346),
    ("claude-opus-4-1", "any", 313), ("claude-haiku-4-5", "none", 346), ("sonnet", "tool", 313),
    ("claude-3-opus-20240229", "auto", 530), ("claude-3-5-haiku-latest", "any", 340),
    ("claude-3-sonnet-20240229", "auto", 159), ("gpt-4o", "auto", None),
])
def test_tool_use_prompt_table(model, choice, tokens):
    use = P.tool_use_prompt(model, choice)
    assert use.tokens == tokens
    assert "tool-use" in use.source
    with pytest.raises(ValueError):
        P.tool_use_prompt(model, "sometimes")


def test_bridged_servers_need_the_bridge_skill(tmp_path):
    skills = _skills(tmp_path)
    with pytest.raises(P.PrefixError, match="mcp-bridge"):
        P.build_prefix("p", ["reply"], skills, bridged_servers=["tracker"])
    (skills / "mcp-bridge").mkdir()
    prefix = P.build_prefix("p", ["reply", "mcp-bridge"], skills, bridged_servers=["tracker"])
    assert prefix.components["cli_index"].endswith(
        "- mcp-bridge tracker (MCP server tracker, skill mcp-bridge): `mcp-bridge tracker --help`")


class ScriptedCounts:
    """A stand-in for ``anthropic.Anthropic()``: ``messages.count_tokens`` computes input tokens
    from a script: 7 for the request itself, one per word of the system text, each tool's
    scripted cost, and 346 once when any tool is present."""

    FIXED = 346
    BASE = 7

    def __init__(self, tool_costs: dict[str, int]) -> None:
        self.tool_costs = tool_costs
        self.requests: list[dict] = []
        self.messages = self

    def count_tokens(self, **request):
        self.requests.append(request)
        tools = request.get("tools", [])
        tokens = self.BASE + len(request.get("system", "").split()) \
            + sum(self.tool_costs[t["name"]] for t in tools) + (self.FIXED if tools else 0)

        class Answer:
            input_tokens = tokens

        return Answer()


def _words(text: str) -> int:
    return len(text.split())


def test_claude_delta_method(tmp_path):
    prefix = _prefix(tmp_path)
    client = ScriptedCounts({"bash": 90, "mcp__tracker__create_issue": 120,
                             "mcp__tracker__search_issues": 75})
    api = ClaudeCountTokens(client, "claude-sonnet-4-5")
    m = measure_claude(prefix, api, O200kCounter(), P)
    got = {c.name: c.tokens for c in m.components}
    parts = prefix.parts()
    # Each text part: exactly its scripted words (the separators cost nothing in the script).
    for name in ("role_prompt", "skills_index", "cli_index", "mcp_instructions"):
        assert got[name] == _words(parts[name]), name
    assert got["shell_tool"] == 90
    assert got["mcp_tools"] == 120 + 75
    # The fixed prompt is counted once, as its own row, never per tool.
    assert got["tool_use_system_prompt"] == 346
    assert m.component("tool_use_system_prompt").method == "remainder"
    assert got["joins"] == 0
    assert m.total_tokens == _words(prefix.system_text()) + 90 + 120 + 75 + 346
    assert {t.name: t.marginal_tokens for t in m.tools} == {
        "bash": 90, "mcp__tracker__create_issue": 120, "mcp__tracker__search_issues": 75}
    # Every request carried the model and the probe message; none was sent twice.
    digests = [request_digest(r) for r in client.requests]
    assert len(digests) == len(set(digests)) == api.requests_sent
    assert all(r["model"] == "claude-sonnet-4-5" for r in client.requests)
    sent = api.requests_sent
    again = measure_claude(prefix, api, O200kCounter(), P)
    assert again == m and api.requests_sent == sent  # answered from the digest cache


def test_claude_delta_with_one_tool_uses_the_table_for_the_fixed_prompt(tmp_path):
    prefix = P.build_prefix("Be brief.", ["reply"], _skills(tmp_path), shell_tool=P.SHELL_TOOL)
    api = ClaudeCountTokens(ScriptedCounts({"bash": 90}), "claude-sonnet-4-5")
    m = measure_claude(prefix, api, O200kCounter(), P)
    assert m.component("shell_tool").tokens == 90
    assert m.component("tool_use_system_prompt").tokens == 346
    assert m.component("tool_use_system_prompt").method == "table"
    assert m.tools[0].marginal_tokens == 90
    assert m.total_tokens == _words(prefix.system_text()) + 90 + 346


def test_count_tokens_answer_without_a_count_is_an_error():
    class Broken:
        def __init__(self):
            self.messages = self

        def count_tokens(self, **request):
            return {"input_tokens": "many"}

    from fleetctl.errors import InputError

    with pytest.raises(InputError, match="input_tokens"):
        ClaudeCountTokens(Broken(), "m").count_request("s", [])


def test_no_chars_over_four_anywhere():
    # Never a characters/4 guess presented as a count: no such arithmetic in fleetctl/tokens.
    source = "\n".join(p.read_text() for p in (REPO / "fleetctl" / "tokens").glob("*.py"))
    assert not re.search(r"len\([^)]*\)\s*(//|/)\s*4\b", source)


def test_loading_the_prefix_builder_writes_nothing_into_the_blueprint(tmp_path, monkeypatch):
    """Measuring imports the blueprint's runner/fleet_runner/prefix.py; it must leave no
    __pycache__ there (an untracked file makes the source dirty for ship, and a blueprint
    shipped with --allow-dirty would carry it to every host). Before, the import wrote
    prefix.cpython-3XX.pyc beside it."""
    import shutil

    monkeypatch.delenv("PYTHONDONTWRITEBYTECODE", raising=False)
    monkeypatch.setattr("sys.dont_write_bytecode", False)
    blueprint = tmp_path / "blueprint"
    shutil.copytree(REPO / "blueprint" / "runner" / "fleet_runner",
                    blueprint / "runner" / "fleet_runner",
                    ignore=shutil.ignore_patterns("__pycache__"))
    (blueprint / "runner" / "fleet_runner" / "prefix.py").write_text(
        (REPO / "blueprint" / "runner" / "fleet_runner" / "prefix.py").read_text()
        + "\n# a copy of its own, so it is imported afresh\n")
    module = load_prefix_module(blueprint)
    assert module.MCP_TOOL_PREFIX == P.MCP_TOOL_PREFIX
    left = sorted(str(p.relative_to(blueprint)) for p in blueprint.rglob("*")
                  if "__pycache__" in p.parts)
    assert left == []

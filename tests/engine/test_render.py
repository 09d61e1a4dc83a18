"""Rendering the blueprint: modes from git metadata, templates byte-exact, clear errors."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from fleetctl.blueprint import load_blueprint
from fleetctl.errors import InputError
from fleetctl.inventory import load_inventory
from fleetctl.linesources import line_sources
from fleetctl.manifest import sha256_digest
from fleetctl.render import render_host, render_template
from tests.helpers import Symlink, cli, local_host, make_project, snapshot, write_inventory


def _render(tmp_path: Path, bp: Path, **host_extra):
    inv = write_inventory(tmp_path / "inv.yaml", {"h": local_host(tmp_path / "box", **host_extra)})
    blueprint = load_blueprint(bp)
    host = load_inventory(inv, set(blueprint.roles)).hosts[0]
    return render_host(blueprint, host)


def test_modes_come_from_git_not_from_the_checkout(tmp_path):
    bp = make_project(tmp_path, {"runner": {"tool": "#!/bin/sh\n", "data": "x"}},
                      executable=("runner/tool",))
    # The checkout says the opposite of what git records: git must win.
    os.chmod(bp / "runner" / "tool", 0o644)
    os.chmod(bp / "runner" / "data", 0o755)
    tree = _render(tmp_path, bp)
    assert tree.manifest.get("runner/tool").mode == "0755"
    assert tree.manifest.get("runner/data").mode == "0644"


def test_declared_mode_wins_and_declared_empty_dirs_exist(tmp_path):
    bp = make_project(tmp_path, {"runner": {"secret.txt": "x"}},
                      attributes={"files": [{"match": "runner/*.txt", "mode": "0600"}],
                                  "dirs": [{"path": "runner/spool", "mode": "1777"},
                                           {"path": "runner/empty/deep", "mode": "0700"}]})
    tree = _render(tmp_path, bp)
    assert tree.manifest.get("runner/secret.txt").mode == "0600"
    assert tree.manifest.get("runner/spool").mode == "1777"
    assert tree.manifest.get("runner/empty/deep").mode == "0700"
    assert tree.manifest.get("runner/empty").mode == "0755"


def test_unquoted_octal_mode_is_an_error_naming_the_file(tmp_path):
    bp = make_project(tmp_path, {"runner": {"a": "x"}})
    (bp / "attributes.yaml").write_text("files:\n  - match: runner/a\n    mode: 0644\n")
    with pytest.raises(InputError) as exc:
        load_blueprint(bp)
    assert "attributes.yaml:3: files[0].mode" in exc.value.message
    assert "quoted" in exc.value.message


def test_dangling_symlink_in_the_blueprint_is_shipped_as_a_symlink(tmp_path):
    bp = make_project(tmp_path, {"runner": {"link": Symlink("../nowhere/at-all")}})
    tree = _render(tmp_path, bp)
    entry = tree.manifest.get("runner/link")
    assert (entry.type, entry.target) == ("symlink", "../nowhere/at-all")


@pytest.mark.parametrize("source,expected", [
    (b"a={{ x }}\n", b"a=1\n"),                     # final newline kept
    (b"a={{ x }}", b"a=1"),                         # no final newline stays none
    (b"a={{ x }}\r\nb\r\n", b"a=1\r\nb\r\n"),       # CRLF kept
    (b"{% if false %}x{% endif %}", b""),           # renders empty: empty file
    (b"\xc3\xa9={{ x }}\n\n", "\u00e9=1\n\n".encode()),  # UTF-8 and blank final line
])
def test_templates_keep_newlines_and_emptiness(source, expected):
    assert render_template(source, "t.j2", {"x": 1}) == expected


def test_undefined_variable_names_template_line_and_name():
    with pytest.raises(InputError) as exc:
        render_template(b"one\ntwo\nthree={{ missing_var }}\n", "runner/conf.j2", {})
    assert exc.value.message == "runner/conf.j2:3: undefined variable 'missing_var'"


def test_template_suffix_is_dropped_and_output_is_byte_exact(tmp_path):
    bp = make_project(tmp_path, {"runner": {"env.j2": "H={{ host.name }}\r\n",
                                            "raw.bin": b"\x00\xff{{ not_a_template }}"}})
    tree = _render(tmp_path, bp)
    env = tree.manifest.get("runner/env")
    assert env.digest == sha256_digest(b"H=h\r\n")
    assert "runner/env.j2" not in tree.manifest
    assert tree.manifest.get("runner/raw.bin").digest == sha256_digest(b"\x00\xff{{ not_a_template }}")


def test_agent_dirs_and_no_credentials_in_the_release(tmp_path):
    bp = make_project(tmp_path, {"runner": {"a": "x"}})
    tree = _render(tmp_path, bp)
    assert tree.manifest.get("agents/w1/agent.yaml").digest == sha256_digest(b"agent: w1\nrole: worker\n")
    # Credentials live beside the releases (credentials/<agent>/), never inside one.
    assert tree.manifest.get("agents/w1/credentials") is None
    assert not any(p.startswith("credentials") for p in tree.manifest.paths())


def test_only_skills_of_the_hosts_roles_are_shipped(tmp_path):
    bp = make_project(tmp_path, {"skills": {"used": {"SKILL.md": "u"}, "unused": {"SKILL.md": "n"}}},
                      roles={"worker": {"prompt": "p", "skills": ["used"]}})
    tree = _render(tmp_path, bp)
    assert "skills/used/SKILL.md" in tree.manifest
    assert "skills/unused" not in tree.manifest


def test_role_naming_a_missing_skill_is_an_error(tmp_path):
    bp = make_project(tmp_path, {}, roles={"worker": {"prompt": "p", "skills": ["ghost"]}})
    with pytest.raises(InputError) as exc:
        load_blueprint(bp)
    assert "worker.yaml:" in exc.value.message and "skills[0]" in exc.value.message
    assert "ghost" in exc.value.message


def test_render_out_writes_the_tree_with_modes(tmp_path):
    bp = make_project(tmp_path, {"runner": {"tool": "#!/bin/sh\n", "l": Symlink("tool")}},
                      executable=("runner/tool",))
    inv = write_inventory(tmp_path / "inv.yaml", {"h": local_host(tmp_path / "box")})
    out = tmp_path / "out"
    run = cli("render", "h", "--out", str(out), inventory=inv, blueprint=bp)
    assert run.code == 0, run.stderr
    snap = snapshot(out)
    assert snap[b"runner/tool"][1] == 0o755
    assert snap[b"runner/l"][0] == "symlink" and snap[b"runner/l"][4] == b"tool"
    assert b"agents/w1/credentials" not in snap
    # never overwrites
    again = cli("render", "h", "--out", str(out), inventory=inv, blueprint=bp)
    assert again.code == 2 and "not an empty directory" in again.stderr


def test_blueprint_outside_git_uses_declared_modes_only(tmp_path):
    bp = make_project(tmp_path, {"runner": {"tool": "x"}}, use_git=False)
    os.chmod(bp / "runner" / "tool", 0o755)
    tree = _render(tmp_path, bp)
    assert tree.manifest.get("runner/tool").mode == "0644"


def test_agent_vars_win_over_host_vars_in_the_agent_config(tmp_path):
    """Regression: host vars used to override the agent's own var of the same name."""
    bp = make_project(tmp_path, {}, agent_template="channel={{ channel }}\n")
    inv = write_inventory(tmp_path / "inv.yaml", {"h": local_host(
        tmp_path / "box", agents={"w1": {"role": "worker", "vars": {"channel": "#agent"}}},
        vars={"channel": "#host"})})
    blueprint = load_blueprint(bp)
    tree = render_host(blueprint, load_inventory(inv, set(blueprint.roles)).hosts[0])
    assert tree.manifest.get("agents/w1/agent.yaml").digest == sha256_digest(b"channel=#agent\n")


@pytest.mark.parametrize("owner", ["root", "0:0", "root:"])
def test_owner_must_name_user_and_group(tmp_path, owner):
    """Regression: a bare user or numeric id never matches a scan's "user:group" and drifted
    forever; it is now refused at load."""
    bp = make_project(tmp_path, {"runner": {"a": "x"}},
                      attributes={"files": [{"match": "runner/a", "owner": owner}]})
    with pytest.raises(InputError) as exc:
        load_blueprint(bp)
    assert "files[0].owner" in exc.value.message and "user:group" in exc.value.message
    inv = write_inventory(tmp_path / "inv.yaml", {"h": local_host(tmp_path / "box", owner=owner)})
    run = cli("drift", inventory=inv, blueprint=make_project(tmp_path / "p2", {}))
    assert run.code == 2 and "hosts.h.owner" in run.stderr


REPO = Path(__file__).resolve().parents[2]
BRIDGE_SKILL = {"skills": {"mcp-bridge": {
    "SKILL.md": "---\nname: mcp-bridge\nsummary: MCP tools as a CLI.\n---\n",
    "bin": {"mcp-bridge": "#!/bin/sh\n"}}}}
MCP_ROLE = {"prompt": "p", "skills": ["mcp-bridge"], "mcp_servers": {
    "tracker": {"via": "bridge", "command": ["tracker-mcp", "--stdio"],
                "env": {"TRACKER_URL": "http://t"}},
    "wiki": {"command": ["wiki-mcp"], "env": {"WIKI_TOKEN": "w"}, "cwd": "srv"},
    "saved": {"snapshot": "tools.json"}}}


def test_the_bridge_config_holds_only_the_via_bridge_servers_the_bridge_reads(tmp_path):
    bp = make_project(tmp_path, {"runner": {"a": "x"}, **BRIDGE_SKILL}, roles={"worker": MCP_ROLE})
    tree = _render(tmp_path, bp)
    entry = tree.manifest.get("agents/w1/mcp-bridge.json")
    config = json.loads(tree.contents[entry.digest])
    # Only via-bridge servers (wiki is via mcp, saved cannot be started); exactly the shape
    # mcp-bridge's load_config accepts.
    assert config == {"servers": {"tracker": {"command": ["tracker-mcp", "--stdio"],
                                              "env": {"TRACKER_URL": "http://t"}}}}
    assert entry.mode == "0644"
    bridge = REPO / "blueprint/skills/mcp-bridge/bin/mcp-bridge"
    out_dir = tmp_path / "rel" / "agents" / "w1"
    out_dir.mkdir(parents=True)
    (out_dir / "mcp-bridge.json").write_bytes(tree.contents[entry.digest])
    listed = subprocess.run([sys.executable, str(bridge), "--help"], capture_output=True, text=True,
                            env={**os.environ, "FLEET_RELEASE": str(tmp_path / "rel"),
                                 "FLEET_AGENT": "w1"})
    assert listed.returncode == 0 and "tracker" in listed.stdout, listed.stderr
    assert "wiki" not in listed.stdout


def test_a_role_whose_servers_are_all_via_mcp_gets_no_bridge_config(tmp_path):
    bp = make_project(tmp_path, {"runner": {"a": "x"}}, roles={"worker": {
        "prompt": "p", "mcp_servers": {"tracker": {"command": ["tracker-mcp"]}}}})
    assert _render(tmp_path, bp).manifest.get("agents/w1/mcp-bridge.json") is None


def test_agent_yaml_carries_the_mcp_servers_the_runner_can_start(tmp_path):
    template = (REPO / "templates" / "agent.yaml.j2").read_text()
    bp = make_project(tmp_path, {"runner": {"a": "x"}, **BRIDGE_SKILL}, roles={"worker": MCP_ROLE},
                      agent_template=template)
    tree = _render(tmp_path, bp)
    text = tree.contents[tree.manifest.get("agents/w1/agent.yaml").digest].decode()
    lines = [ln for ln in text.splitlines() if ln.startswith("mcp_servers:")]
    assert len(lines) == 1  # one `key: <JSON>` line, as the runner reads it
    servers = json.loads(lines[0].split(":", 1)[1])
    assert servers == {
        "tracker": {"via": "bridge", "command": ["tracker-mcp", "--stdio"],
                    "env": {"TRACKER_URL": "http://t"}, "cwd": None},
        "wiki": {"via": "mcp", "command": ["wiki-mcp"], "env": {"WIKI_TOKEN": "w"},
                 "cwd": "srv"}}  # saved (a snapshot) cannot be started: left out
    assert servers == __import__("yaml").safe_load(text)["mcp_servers"]  # valid YAML too
    # The runner's own parser reads it.
    sys.path.insert(0, str(REPO / "blueprint" / "runner"))
    from fleet_runner.config import config_from_data, parse_config_text

    config = config_from_data(parse_config_text(text))
    assert [(s.name, s.via, s.command, s.cwd) for s in config.mcp_servers] == [
        ("tracker", "bridge", ("tracker-mcp", "--stdio"), None),
        ("wiki", "mcp", ("wiki-mcp",), "srv")]
    assert config.bridged_servers == ["tracker"]
    # Without servers the key is still there, empty.
    plain = make_project(tmp_path / "p2", {"runner": {"a": "x"}}, agent_template=template)
    text = (lambda t: t.contents[t.manifest.get("agents/w1/agent.yaml").digest].decode())(
        _render(tmp_path / "p2", plain))
    assert "\nmcp_servers: {}\n" in text


def test_via_bridge_without_the_bridge_skill_is_an_input_error_naming_the_line(tmp_path):
    role = {**MCP_ROLE, "skills": []}
    bp = make_project(tmp_path, {"runner": {"a": "x"}, **BRIDGE_SKILL}, roles={"worker": role})
    text = (bp / "roles" / "worker.yaml").read_text().splitlines()
    line = next(i for i, ln in enumerate(text, 1) if ln.strip() == "via: bridge")
    with pytest.raises(InputError) as exc:
        _render(tmp_path, bp)
    assert f"roles/worker.yaml:{line}: mcp_servers.tracker.via: bridge needs the " \
           "mcp-bridge skill" in exc.value.message
    assert "add mcp-bridge" in exc.value.hint
    inv = write_inventory(tmp_path / "inv2.yaml", {"h": local_host(tmp_path / "box2")})
    run = cli("render", "h", "--out", str(tmp_path / "out"), inventory=inv, blueprint=bp)
    assert run.code == 2 and f"worker.yaml:{line}: mcp_servers.tracker.via" in run.stderr


def test_via_bridge_needs_a_command_and_via_is_mcp_or_bridge(tmp_path):
    for i, (server, problem) in enumerate((
            ({"via": "bridge", "snapshot": "t.json"}, "bridge needs a command"),
            ({"via": "cli", "command": ["x"]}, "input should be 'mcp' or 'bridge'"))):
        bp = make_project(tmp_path / str(i), {"runner": {"a": "x"}, **BRIDGE_SKILL},
                          roles={"worker": {"prompt": "p", "skills": ["mcp-bridge"],
                                            "mcp_servers": {"tracker": server}}})
        text = (bp / "roles" / "worker.yaml").read_text().splitlines()
        line = next(i for i, ln in enumerate(text, 1) if ln.strip().startswith("via:"))
        with pytest.raises(InputError) as exc:
            load_blueprint(bp)
        assert f"worker.yaml:{line}: mcp_servers.tracker.via: " in exc.value.message
        assert problem in exc.value.message


def test_a_role_without_mcp_servers_gets_no_bridge_config(tmp_path):
    bp = make_project(tmp_path, {"runner": {"a": "x"}})
    assert _render(tmp_path, bp).manifest.get("agents/w1/mcp-bridge.json") is None


def test_via_mcp_servers_need_the_placeholder_in_the_agent_command_at_load(tmp_path):
    """The runner refuses such a role at startup on the host; fleetctl says so before a ship."""
    bp = make_project(tmp_path, {"runner": {"a": "x"}}, roles={"worker": {
        "prompt": "p", "agent_command": ["agent", "-p"],
        "mcp_servers": {"tracker": {"command": ["tracker-mcp"]}}}})
    with pytest.raises(InputError) as caught:
        load_blueprint(bp)
    assert "worker.yaml:" in caught.value.message and "agent_command" in caught.value.message
    assert "{mcp_config}" in caught.value.message
    (bp / "roles" / "worker.yaml").write_text(yaml.safe_dump({
        "prompt": "p", "agent_command": ["agent", "--mcp-config", "{mcp_config}"],
        "mcp_servers": {"tracker": {"command": ["tracker-mcp"]}}}))
    assert "worker" in load_blueprint(bp).roles


# -- which variables each rendered line comes from (backport's hint) ---------------------------

_VALUES = st.one_of(st.integers(-5, 5), st.booleans(), st.text("ab c", max_size=6),
                    st.lists(st.integers(0, 3), max_size=3), st.none())


@settings(max_examples=200, deadline=None)
@given(plan=st.lists(st.one_of(st.none(), st.integers(0, 3)), min_size=1, max_size=8),
       values=st.lists(_VALUES, min_size=4, max_size=4),
       nested=st.booleans())
def test_each_rendered_line_is_traced_to_the_variables_it_shows(plan, values, nested):
    """A template whose lines are literal text or show one variable (a top-level var, or a
    key of ``role``), with any values: every line is traced to exactly the variable it shows,
    and a literal line to none."""
    names = [f"v{i}" for i in range(4)]
    lines = [f"literal {n}" if pick is None else
             (f"{n}: {{{{ role.{names[pick]} | tojson }}}}" if nested else
              f"{n}: {{{{ {names[pick]} | tojson }}}}") for n, pick in enumerate(plan)]
    context = {"role": dict(zip(names, values, strict=True))} if nested else \
        dict(zip(names, values, strict=True))
    found = line_sources("\n".join(lines).encode(), "t.j2", context)
    expect = [set() if pick is None else
              {("role", names[pick]) if nested else (names[pick],)} for pick in plan]
    assert found == expect

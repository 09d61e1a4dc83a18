"""Runner modules one by one: prefix, config (against fleetctl's real rendering), inbox
messages, snapshots, process groups, and the standard-library-only promise."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
RUNNER = REPO / "blueprint" / "runner"
sys.path.insert(0, str(RUNNER))

from fleet_runner.config import ConfigError, load_config, parse_config_text  # noqa: E402
from fleet_runner.inbox import MessageError, parse_message  # noqa: E402
from fleet_runner.invoke import run_in_group  # noqa: E402
from fleet_runner.prefix import NO_SUMMARY, PrefixError, build_prefix  # noqa: E402
from fleet_runner.snapshot import diff_snapshots, take_snapshot  # noqa: E402
from fleet_runner.tokens import count_tokens  # noqa: E402

from fleetctl.blueprint import load_blueprint  # noqa: E402
from fleetctl.inventory import load_inventory  # noqa: E402
from fleetctl.render import render_host  # noqa: E402
from tests.helpers import WAIT_S  # noqa: E402

SKILLS = REPO / "blueprint" / "skills"


# -- prefix ---------------------------------------------------------------------------------

def test_prefix_components_and_text():
    prefix = build_prefix("You are QA.\n\n", ["reply", "notify"], SKILLS)
    assert list(prefix.components) == ["role_prompt", "skills_index", "cli_index"]
    assert prefix.components["role_prompt"] == "You are QA."
    skills = prefix.components["skills_index"].splitlines()
    assert skills[1:] == ["- reply: Send a reply to the chat channel the task came from.",
                          "- notify: Escalate to a person when a task cannot be finished."]
    clis = prefix.components["cli_index"].splitlines()
    assert clis[1:] == ["- reply (skill reply): `reply --help`",
                        "- notify (skill notify): `notify --help`"]
    assert prefix.text == "\n\n".join(prefix.components.values())
    assert prefix.tokens(count_tokens)["role_prompt"] == 3  # 11 bytes -> ceil(11/4)


def test_prefix_is_the_same_from_the_blueprint_and_from_a_release(tmp_path):
    # fleetctl tokens measures the blueprint; the runner builds from a release where modes
    # may differ: the text must not depend on either.
    release_skills = tmp_path / "skills"
    shutil.copytree(SKILLS, release_skills)
    for cli in release_skills.glob("*/bin/*"):
        os.chmod(cli, 0o644)
    (release_skills / "reply" / "bin" / ".hidden").write_text("")
    a = build_prefix("p", ["reply", "notify", "forge"], SKILLS)
    b = build_prefix("p", ["reply", "notify", "forge"], release_skills)
    assert a == b


def test_prefix_errors_and_missing_summaries(tmp_path):
    (tmp_path / "bare" / "bin").mkdir(parents=True)
    (tmp_path / "bare" / "SKILL.md").write_text("# no front matter\nsummary: not this\n")
    prefix = build_prefix("p", ["bare"], tmp_path)
    assert prefix.components["skills_index"].endswith(f"- bare: {NO_SUMMARY}")
    assert prefix.components["cli_index"] == ""  # no CLIs: no index, no heading
    with pytest.raises(PrefixError, match="nosuch"):
        build_prefix("p", ["bare", "nosuch"], tmp_path)


# -- config ---------------------------------------------------------------------------------

def _render_agent_configs(tmp_path: Path) -> tuple[dict, dict[str, Path]]:
    """Render every agent of the demo inventory with fleetctl; return roles and config paths."""
    blueprint = load_blueprint(REPO / "blueprint", REPO / "templates")
    inventory = load_inventory(REPO / "inventory" / "demo.yaml", set(blueprint.roles))
    paths = {}
    for host in inventory.hosts:
        tree = render_host(blueprint, host, with_credentials=False)  # no secrets needed
        for agent in host.agents:
            entry = tree.manifest.get(f"agents/{agent.name}/agent.yaml")
            path = tmp_path / f"{agent.name}.yaml"
            path.write_bytes(tree.contents[entry.digest])
            paths[agent.name] = (path, blueprint.roles[agent.role])
    return blueprint.roles, paths


def test_the_rendered_agent_config_reads_back_with_the_standard_library(tmp_path):
    _, configs = _render_agent_configs(tmp_path)
    assert configs
    for name, (path, role) in configs.items():
        config = load_config(path)
        assert config.agent == name
        assert config.prompt == role.prompt and list(config.skills) == role.skills
        assert config.check == role.check and config.max_retries == role.max_retries
        assert config.budget_tokens == role.budget_tokens and config.model == role.model
        # The same file read as YAML says the same (JSON values are YAML).
        as_yaml = yaml.safe_load(path.read_text())
        assert as_yaml == parse_config_text(path.read_text())


def test_config_errors_name_file_line_and_key(tmp_path):
    bad = tmp_path / "agent.yaml"
    bad.write_text('agent: "a"\nprompt: "p"\nskills: [reply\n')
    with pytest.raises(ConfigError, match=r"agent.yaml:3: skills: not a JSON value"):
        load_config(bad)
    bad.write_text('agent: "a"\nprompt: "p"\nmax_retries: "3"\n')
    with pytest.raises(ConfigError, match="max_retries: expected int"):
        load_config(bad)
    bad.write_text('agent: "a"\nprompt: "p"\nagent_command: ["x", "--model", "{model}"]\n')
    with pytest.raises(ConfigError, match="model is null"):
        load_config(bad).argv()
    bad.write_text('prompt: "p"\n')
    with pytest.raises(ConfigError, match="agent: required"):
        load_config(bad)


# -- inbox messages -------------------------------------------------------------------------

def test_message_shape():
    msg = parse_message(json.dumps({"id": "slack:C1:17.5", "from": {"kind": "human",
                                    "name": "alice"}, "channel": "#s", "text": "hi",
                                    "reply_to": "m0", "extra": 1}).encode())
    assert (msg.id, msg.human, msg.channel, msg.reply_to) == ("slack:C1:17.5", True, "#s", "m0")
    for body, problem in [
        (b"not json", "not UTF-8 JSON"),
        (b"[]", "not a JSON object"),
        (b'{"id": "../x", "from": {"kind": "agent", "name": "p"}, "text": ""}', "id:"),
        (b'{"id": "a", "text": ""}', "from: required"),
        (b'{"id": "a", "from": {"name": "p"}, "text": ""}', "from.kind: required"),
        (b'{"id": "a", "from": {"kind": "human", "name": "p"}, "text": "x"}', "channel:"),
        (b'{"id": "a", "from": {"kind": "agent", "name": "p"}}', "text:"),
    ]:
        with pytest.raises(MessageError, match=problem):
            parse_message(body)


def test_a_sender_kind_not_allowed_is_named_as_such():
    body = b'{"id": "a", "from": {"kind": "robot", "name": "p"}, "channel": "#c", "text": "x"}'
    with pytest.raises(MessageError) as caught:
        parse_message(body)
    assert str(caught.value) == ('from.kind: "robot" is not one of the allowed kinds, '
                                 '"human" or "agent"')


@pytest.mark.parametrize("line, problem", [
    ('max_retries: "3"', "max_retries: expected int, got str"),
    ("max_retries: -1", "max_retries: must be 0 or more"),
    ("timeout_s: 0", "timeout_s: must be a number of seconds above 0"),
    ('skills: ["reply", 1]', "skills: every item must be a string"),
    ("agent_command: []", "agent_command: must not be empty"),
    ('writes: ["!"]', "writes: '!': matches nothing"),
    ('credentials_dir: "creds"', "credentials_dir: must be an absolute path"),
    ('sync: {"branch": "a..b"}', "sync.branch: expected a branch name"),
    ('mcp_servers: {"w": {"command": []}}', "mcp_servers.w.command: expected a non-empty"),
])
def test_config_type_errors_name_the_line_like_parse_errors(tmp_path, line, problem):
    config = tmp_path / "c1.yaml"
    config.write_text('# rendered by fleetctl\nagent: "a"\n\nrole: "r"\nprompt: "p"\n'
                      f'host: "h1"\n{line}\nmodel: null\n')
    with pytest.raises(ConfigError) as caught:
        load_config(config)
    assert str(caught.value).startswith(f"{config}:7: {problem}"), str(caught.value)


# -- snapshots ------------------------------------------------------------------------------

def test_snapshots_see_content_not_metadata(tmp_path):
    (tmp_path / ".git").mkdir()
    (tmp_path / ".git" / "index").write_text("x")
    (tmp_path / "a.py").write_text("aaaa")
    (tmp_path / "gone.py").write_text("g")
    (tmp_path / "link").symlink_to("/etc")
    before = take_snapshot(tmp_path)
    assert set(before) == {"a.py", "gone.py", "link"}  # .git skipped, the link not followed
    st = os.stat(tmp_path / "a.py")
    (tmp_path / "a.py").write_text("bbbb")  # same size ...
    os.utime(tmp_path / "a.py", ns=(st.st_atime_ns, st.st_mtime_ns))  # ... same mtime
    (tmp_path / "gone.py").unlink()
    (tmp_path / "new.py").write_text("n")
    changes = diff_snapshots(before, take_snapshot(tmp_path))
    assert (changes.added, changes.modified, changes.removed) == (
        ("new.py",), ("a.py",), ("gone.py",))
    assert changes.touched == ("a.py", "new.py")


def _git(cwd: Path, *args: str) -> str:
    return subprocess.run(["git", "-c", "user.name=T", "-c", "user.email=t@example.org", *args],
                          cwd=cwd, check=True, capture_output=True, text=True).stdout.strip()


def test_snapshots_see_a_git_directory_s_config_and_hooks_but_not_its_bookkeeping(tmp_path):
    _git(tmp_path, "init", "-q", "-b", "main")
    (tmp_path / "a.py").write_text("a\n")
    _git(tmp_path, "add", "a.py")
    _git(tmp_path, "commit", "-q", "-m", "one")
    (tmp_path / "vendor" / "lib").mkdir(parents=True)
    _git(tmp_path / "vendor" / "lib", "init", "-q")
    before = take_snapshot(tmp_path)
    assert ".git/config" in before and ".git/HEAD" not in before and ".git/index" not in before
    assert "vendor/lib/.git/HEAD" in before  # a nested repository is not the workspace's own
    # git's own bookkeeping: a commit, a branch, a stash, a fetch
    (tmp_path / "a.py").write_text("b\n")
    _git(tmp_path, "commit", "-q", "-am", "two")
    _git(tmp_path, "branch", "side")
    (tmp_path / "a.py").write_text("c\n")
    _git(tmp_path, "stash", "-q")
    _git(tmp_path, "fetch", "-q", str(tmp_path), "main")
    # what makes git run code or look elsewhere
    (tmp_path / ".git" / "hooks" / "post-merge").write_text("#!/bin/sh\n")
    _git(tmp_path, "config", "core.fsmonitor", "/tmp/x")
    (tmp_path / ".git" / "info" / "attributes").write_text("* filter=x\n")
    (tmp_path / ".git" / "modules" / "sub" / "hooks").mkdir(parents=True)
    (tmp_path / ".git" / "modules" / "sub" / "HEAD").write_text("ref: refs/heads/main\n")
    (tmp_path / ".git" / "modules" / "sub" / "hooks" / "pre-commit").write_text("x")
    (tmp_path / ".git" / "modules" / "sub" / "index").write_text("x")
    (tmp_path / "vendor" / "lib" / ".git" / "hooks" / "pre-commit").write_text("x")
    (tmp_path / "vendor" / "lib" / ".git" / "x").write_text("x")
    changes = diff_snapshots(before, take_snapshot(tmp_path))
    # (a submodule's git directory has bookkeeping of its own: its HEAD and index)
    assert changes.added == (".git/hooks/post-merge", ".git/info/attributes",
                             ".git/modules/sub/hooks/pre-commit",
                             "vendor/lib/.git/hooks/pre-commit", "vendor/lib/.git/x")
    assert changes.modified == (".git/config", "a.py") and changes.removed == ()


# -- process groups -------------------------------------------------------------------------

def test_stdin_is_closed_even_when_the_command_never_reads_it(tmp_path):
    # 4 MiB: far more than a pipe buffer; a blocking write would hang the runner.
    # The limit is far above what a busy machine needs: the test waits on the command, not a clock.
    inv = run_in_group(["sh", "-c", "sleep 0.2; echo ok"], stdin=b"x" * (4 << 20),
                       cwd=tmp_path, env=os.environ, timeout_s=120, kill_grace_s=0.2,
                       stdout_path=tmp_path / "out")
    assert inv.stopped is None and not inv.timed_out
    assert inv.exit_status == 0 and (tmp_path / "out").read_text() == "ok\n"


def test_the_command_sees_end_of_file_and_its_own_group(tmp_path):
    script = "import os, sys; sys.stdin.read(); print(os.getpgid(0), os.getpid())"
    inv = run_in_group([sys.executable, "-c", script],
                       stdin=b"prompt", cwd=tmp_path, env=os.environ, timeout_s=10,
                       kill_grace_s=0.2, stdout_path=tmp_path / "out",
                       stderr_path=tmp_path / "err")
    pgid, pid = (tmp_path / "out").read_text().split()
    assert inv.exit_status == 0 and pgid == pid == str(inv.pid)
    assert os.getpgid(0) != inv.pid


def test_a_command_that_cannot_start_is_reported_not_raised(tmp_path):
    inv = run_in_group([str(tmp_path / "nosuch")], stdin=b"", cwd=tmp_path, env=os.environ,
                       timeout_s=5, kill_grace_s=0.1, stdout_path=tmp_path / "out")
    assert inv.pid is None and "nosuch" in inv.start_error
    assert inv.describe().startswith("could not start")


# -- standard library only ------------------------------------------------------------------

def test_the_runner_imports_with_the_standard_library_alone(tmp_path):
    # -S: no site-packages at all; -B: no bytecode written into the runner's tree.
    python = shutil.which("python3") or sys.executable
    code = ("import sys; sys.path.insert(0, sys.argv[1]); import pkgutil, importlib, "
            "fleet_runner; [importlib.import_module('fleet_runner.' + m.name) for m in "
            "pkgutil.iter_modules(fleet_runner.__path__) if m.name != '__main__']; print('ok')")
    done = subprocess.run([python, "-S", "-B", "-c", code, str(RUNNER)], capture_output=True,
                          text=True, cwd=tmp_path, timeout=WAIT_S)
    assert done.returncode == 0 and done.stdout == "ok\n", done.stderr


# -- texts about token counting ------------------------------------------------------------


@pytest.mark.parametrize("rel", ["blueprint/runner/fleet_runner/__init__.py",
                                 "blueprint/runner/README.md", "docs/runner.md"])
def test_token_texts_describe_the_labelled_estimate_and_the_exact_counter(rel):
    text = " ".join((REPO / rel).read_text().split())  # line breaks as spaces
    assert "issue 4" not in text.lower()  # nothing is waiting to replace the host's counter
    for phrase in ("bytes/4-estimate", "no pip installs", "o200k_base", "prefix-tokens.json"):
        assert phrase in text, (rel, phrase)


# -- the unreadable-message log rate ---------------------------------------------------------


def test_an_unreadable_message_is_logged_once_then_at_a_bounded_rate(tmp_path, monkeypatch):
    from fleet_runner import loop
    from fleet_runner.paths import agent_paths
    logged: list[str] = []
    runner = loop.Runner(agent_paths("a1", tmp_path), log=lambda _agent, text: logged.append(text))
    clock = [1000.0]
    monkeypatch.setattr(loop.time, "monotonic", lambda: clock[0])
    path = tmp_path / "inbox" / "m.json"
    denied = PermissionError(13, "Permission denied")
    for _ in range(50):  # fifty scans within the interval: one line
        runner._note_unreadable(path, denied)
        clock[0] += 1.0
    assert len(logged) == 1 and str(path) in logged[0] and "Permission denied" in logged[0]
    clock[0] = 1000.0 + loop.UNREADABLE_LOG_INTERVAL_S
    runner._note_unreadable(path, denied)  # the interval is over: logged again
    runner._note_unreadable(path, OSError(5, "Input/output error"))  # a new error: logged
    assert len(logged) == 3 and "Input/output error" in logged[2]

"""Probing a harness: run a role's real agent command against a local endpoint, count what it sent.

For each role (and, beside it, the harness's default tool set) the probe:

1. starts :class:`fleetctl.tokens.endpoint.ProbeEndpoint` on ``127.0.0.1``;
2. runs the agent command as it is rendered for the host (``agent_command`` plus the harness's
   tool flags for the role's ``tools:``, :func:`fleetctl.roledecl.harness_command`; for the
   default set, the bare ``agent_command``), with ``{mcp_config}`` replaced by an empty MCP
   config file (``{"mcpServers": {}}``: MCP tools are counted by the audit from the servers'
   listings) and ``{model}`` by the role's model; the harness's base-URL variable points at the
   endpoint and its key variable holds a made-up key (no real key, no network);
3. runs it in a new session, in an empty working directory, with a temporary ``HOME`` and
   ``XDG_CONFIG_HOME`` (so no user settings, MCP servers or memory files are read), the
   harness's quiet variables (no telemetry, updates or reports), ``LANG=C.UTF-8``, the probe's
   prompt on stdin; waits for it to exit, at most ``timeout_s`` seconds, then kills its process
   group;
4. counts the first ``/v1/messages`` request into a profile
   (:func:`fleetctl.tokens.harness.profile_from_request`).

The captured requests stay in memory and are dropped: only counts and digests are kept.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fleetctl.errors import InputError
from fleetctl.roledecl import HarnessKind, harness_command, role_harness, toolset_key
from fleetctl.tokens.endpoint import ProbeEndpoint
from fleetctl.tokens.harness import Profile, parse_version, profile_from_request

PROBE_PROMPT = "fleetctl harness probe: answer with the single word ok."
"""The prompt the harness is given; it is removed from the first message's count."""

PROBE_KEY = "sk-ant-fleetctl-probe-not-a-key"
"""The API key the harness is given: any value works against the local endpoint."""

DEFAULT_TIMEOUT_S = 60.0
STDERR_TAIL = 1500


class ProbeError(InputError):
    """The harness could not be probed: it did not start, sent no request, or timed out."""


@dataclass(frozen=True, slots=True)
class ProbeResult:
    """One probe run.

    Attributes:
        profile: the harness profile made from the first request.
        argv: the command run (``{mcp_config}`` shown as such).
        exit_code: the harness's exit status (negative: killed by that signal).
        elapsed_s: seconds from start to exit.
        stdout_tail: the end of its stdout (``claude -p --output-format json`` prints its
            result, with the endpoint's made-up usage).
    """

    profile: Profile
    argv: tuple[str, ...]
    exit_code: int
    elapsed_s: float
    stdout_tail: str


def _kill_group(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    proc.wait()


def harness_version(argv0: str, harness: HarnessKind, env: dict[str, str], timeout_s: float
                    ) -> str | None:
    """The harness's version from ``ARGV0 --version`` (``None`` when it gives none in time)."""
    try:
        done = subprocess.run([argv0, "--version"], capture_output=True, env=env,
                              timeout=timeout_s, stdin=subprocess.DEVNULL, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return parse_version(done.stdout.decode("utf-8", "replace"))


def probe_command(command: list[str], harness: HarnessKind, *, counter: Any,
                  tools_declared: list[str] | None, model: str | None = None,
                  timeout_s: float = DEFAULT_TIMEOUT_S, executable: str | None = None
                  ) -> ProbeResult:
    """Run one agent command against the local endpoint and profile its first request.

    Args:
        command: the agent command as rendered (placeholders still in).
        harness: its harness (the base-URL, key and quiet variables).
        counter: the exact counter for the profile.
        tools_declared: the built-in tools the command asks for (``None``: the default set).
        model: the role's model, for ``{model}``.
        timeout_s: how long the harness may take, start to exit, in seconds (default 60).
        executable: run this instead of ``command[0]`` (a harness not on ``PATH``).

    Raises:
        ProbeError: the command cannot be started; it sent no ``/v1/messages`` request before
            it exited or before ``timeout_s`` (its exit code and stderr tail are in the
            message); ``{model}`` without a model.
    """
    argv0 = executable or command[0]
    resolved = shutil.which(argv0) if os.sep not in argv0 else os.path.abspath(argv0)
    if resolved is None:
        raise ProbeError(f"cannot probe {harness.name}: {argv0!r} is not on PATH",
                         hint="install the harness (scripts/setup.sh --test puts Claude Code in "
                              ".tools/), or pass --harness-bin PATH")
    with tempfile.TemporaryDirectory(prefix="fleetctl-probe-") as tmp, ProbeEndpoint() as ep:
        home, work = Path(tmp) / "home", Path(tmp) / "work"
        home.mkdir()
        work.mkdir()
        mcp_config = Path(tmp) / "mcp.json"
        mcp_config.write_text(json.dumps({"mcpServers": {}}), "utf-8")
        argv = [resolved]
        for word in command[1:]:
            if "{model}" in word:
                if model is None:
                    raise ProbeError("agent_command uses {model} but the role sets no model")
                word = word.replace("{model}", model)
            argv.append(word.replace("{mcp_config}", str(mcp_config)))
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(home),
               "XDG_CONFIG_HOME": str(home / ".config"), "TMPDIR": tmp,
               "LANG": "C.UTF-8", "LC_ALL": "C.UTF-8", "TERM": "dumb",
               **harness.quiet_env, harness.base_url_env: ep.base_url,
               harness.key_env: PROBE_KEY}
        version = harness_version(resolved, harness, env, min(timeout_s, 30.0))
        started = time.monotonic()
        out_path, err_path = Path(tmp) / "stdout", Path(tmp) / "stderr"
        with open(out_path, "wb") as out, open(err_path, "wb") as err:
            try:
                proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=out, stderr=err,
                                        cwd=work, env=env, start_new_session=True)
            except OSError as exc:
                raise ProbeError(f"cannot start {argv0!r}: {exc.strerror or exc}") from None
            try:
                assert proc.stdin is not None
                try:
                    proc.stdin.write(PROBE_PROMPT.encode("utf-8"))
                    proc.stdin.close()
                except OSError:
                    pass
                try:
                    code = proc.wait(timeout=timeout_s)
                    timed_out = False
                except subprocess.TimeoutExpired:
                    timed_out = True
            finally:
                _kill_group(proc)  # its children too, whether or not it exited
        elapsed = time.monotonic() - started
        stdout = out_path.read_bytes().decode("utf-8", "replace")
        stderr = err_path.read_bytes().decode("utf-8", "replace")
        messages = ep.messages()
        shown = tuple(command)
        if not messages:
            what = (f"did not finish within {timeout_s:g} s" if timed_out
                    else f"exited with code {code}")
            raise ProbeError(
                f"probing {' '.join(shown)}: the harness {what} without sending a model "
                f"request to the local endpoint" + (f"; stderr: {stderr[-STDERR_TAIL:].strip()}"
                                                    if stderr.strip() else ""),
                hint="raise --probe-timeout for a slow harness" if timed_out else None)
        version = version or parse_version(messages[0].headers.get("user-agent", "")) \
            or "unknown"
        profile = profile_from_request(
            messages[0].body, PROBE_PROMPT, counter, harness=harness.name, version=version,
            toolset=toolset_key(tools_declared), tools_declared=tools_declared,
            requests=len(messages))
        return ProbeResult(profile, shown, -9 if timed_out else code, round(elapsed, 3),
                           stdout[-STDERR_TAIL:])


def probe_role(role: Any, *, counter: Any, default_set: bool = False,
               timeout_s: float = DEFAULT_TIMEOUT_S, executable: str | None = None
               ) -> ProbeResult:
    """Probe a role's harness with the role's tool set, or (``default_set``) the harness's
    default set (the bare ``agent_command``, no tool flags).

    Raises:
        ProbeError: the role has no agent command or an unknown harness, or the probe failed.
    """
    harness = role_harness(role)
    if harness is None or not role.agent_command:
        raise ProbeError("the role has no agent_command of a harness fleetctl knows: nothing "
                         "to probe")
    if default_set:
        command, tools = list(role.agent_command), None
    else:
        command, tools = harness_command(role) or [], role.tools
    return probe_command(command, harness, counter=counter, tools_declared=tools,
                         model=role.model, timeout_s=timeout_s, executable=executable)


@dataclass(frozen=True, slots=True)
class ProbeRun:
    """One tool set probed for ``fleetctl tokens --probe``.

    Attributes:
        role: the role whose command was run.
        result: the probe's result.
        path: where the profile was written, or ``None`` (not written).
        declared_tools: the role's ``tools:`` (``None`` for the default set): the built-in
            tools the harness sent must be exactly these.
        unexpected: names the harness sent beyond ``declared_tools``; ``missing``: declared
            names it did not send (both empty for the default set).
    """

    role: str
    result: ProbeResult
    path: Path | None
    declared_tools: tuple[str, ...] | None
    unexpected: tuple[str, ...] = ()
    missing: tuple[str, ...] = ()


def probe_agents(inventory: Path, blueprint: Path, agents: tuple[str, ...] = (), *,
                 timeout_s: float = DEFAULT_TIMEOUT_S, executable: str | None = None,
                 write: bool = True) -> list[ProbeRun]:
    """Probe the harness of every selected agent's role: its declared tool set, and the
    harness's default set (for the saving), each once; write the profiles into
    ``<blueprint>/harnesses/`` unless ``write`` is false.

    Raises:
        InputError: bad inventory, blueprint or agent name; no selected role runs a harness
            fleetctl can probe. ProbeError: a probe failed (nothing written for it).
    """
    from fleetctl.inventory import load_inventory
    from fleetctl.tokencount.counters import O200kCounter
    from fleetctl.tokens.audit import _select, load_roles
    from fleetctl.tokens.harness import write_profile

    roles = load_roles(Path(blueprint))
    inv = load_inventory(Path(inventory), set(roles))
    selected = _select(inv, agents)
    counter = O200kCounter()
    wanted: dict[tuple[str, str], tuple[str, bool]] = {}
    for _, agent in selected:
        role = roles[agent.role]
        harness = role_harness(role)
        if harness is None or not role.agent_command:
            continue
        wanted.setdefault((harness.name, toolset_key(role.tools)), (agent.role, False))
        wanted.setdefault((harness.name, "default"), (agent.role, True))
    if not wanted:
        raise InputError("none of the selected agents' roles runs a harness fleetctl can probe "
                         "(an agent_command starting with claude, or a harness: key)")
    runs = []
    for _key, (role_name, default_set) in sorted(wanted.items()):
        role = roles[role_name]
        result = probe_role(role, counter=counter, default_set=default_set,
                            timeout_s=timeout_s, executable=executable)
        declared = None if default_set or role.tools is None else tuple(role.tools)
        sent = [t["name"] for t in result.profile.tools]
        unexpected = tuple(n for n in sent if declared is not None and n not in declared)
        missing = tuple(n for n in declared or () if n not in sent)
        path = write_profile(Path(blueprint), result.profile) if write else None
        runs.append(ProbeRun(role_name, result, path, declared, unexpected, missing))
    return runs

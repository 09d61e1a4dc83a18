"""The command line: ``fleet-runner --agent NAME --root ROOT [options]``.

Exit statuses: 0 stopped cleanly (SIGTERM/SIGINT, or ``--once`` with the inbox drained);
2 the agent cannot be served (bad arguments, config or release: checked at startup, before any
message is claimed, and again for each task; the message being worked on, if any, stays in
``processing/`` for the next start); 3 another runner already serves this
agent (its lock is held). When ``current`` is switched to another release, the runner replaces
itself (``exec``) with that release's runner, keeping its pid, at the next point between tasks
(after a task is decided, or while the inbox is empty).
"""

from __future__ import annotations

import argparse
import fcntl
import json
import os
import re
import signal
import sys
from pathlib import Path

from fleet_runner import cgroup, standing, team
from fleet_runner.config import ConfigError, check_servable, load_config
from fleet_runner.invoke import become_subreaper
from fleet_runner.loop import Runner, RunnerError, RunnerOptions, not_root_refusal
from fleet_runner.names import one_line
from fleet_runner.paths import AgentPaths, agent_paths
from fleet_runner.prefix import PrefixError, build_prefix
from fleet_runner.tokens import prefix_tokens as counted_prefix

EXIT_OK, EXIT_ERROR, EXIT_LOCKED = 0, 2, 3


def _say(text: str, agent: str | None = None) -> None:
    """One line on stderr (the journal): what it quotes (a path, a name) may hold a newline."""
    where = f"[{one_line(agent)}]" if agent else ""
    print(f"fleet-runner{where}: {one_line(text)}", file=sys.stderr, flush=True)
_AGENT_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")  # fullmatch: the whole name


def _denials(paths: AgentPaths, permission: str | None) -> int:
    """``--list-denials`` and ``--clear-denial``: print or clear standing denials (exit 0; 2
    when the permission named has no standing denial)."""
    if permission is None:
        print(json.dumps(standing.standing(paths.standing_denials), indent=2))
        return EXIT_OK
    cleared = standing.clear(paths.standing_denials, permission)
    if not cleared and permission != "all":
        held = [d.get("permission") for d in standing.standing(paths.standing_denials)]
        _say(f"no standing denial of {permission!r} for agent {paths.agent} "
             f"(standing: {', '.join(map(str, held)) or 'none'})")
        return EXIT_ERROR
    for name in cleared:
        _say(f"cleared the standing denial of {name} for agent {paths.agent}")
    return EXIT_OK


def _command(paths: AgentPaths, thread: str | None) -> int:
    """``--list-commands`` and ``--clear-command``: print the threads a person is in command
    of, or clear one (the person's action): its paused hand-offs go back to the inbox in their
    order (exit 0; 2 when no person is in command of it, or the team files cannot be
    written: for example by the agent's user)."""
    files = team.TeamFiles(paths.state, paths.inbox, paths.processing)
    if thread is None:
        flags = files.flags() if files.team.is_dir() else {}
        paused = files.paused() if files.team.is_dir() else {}
        print(json.dumps([{**f.to_json(), "paused": paused.get(t, [])}
                          for t, f in sorted(flags.items())], indent=2))
        return EXIT_OK
    try:
        if not files.team.is_dir():
            raise team.TeamError(f"thread {thread}: no person is in command of it (agent "
                                 f"{paths.agent} has no team files in {files.team})")
        with files.locked():
            moved = files.clear(thread)
    except team.TeamError as exc:
        held = sorted(files.flags()) if files.command_dir.is_dir() else []
        _say(f"{exc} (in command: {', '.join(held) or 'none'})", agent=paths.agent)
        return EXIT_ERROR
    except OSError as exc:
        _say(f"cannot clear thread {thread}: {exc} (the person's action: run it as the "
             f"runner's user, uid {paths.state.stat().st_uid if paths.state.exists() else '?'})",
             agent=paths.agent)
        return EXIT_ERROR
    _say(f"cleared the person-in-command flag of thread {thread}; "
         f"{len(moved)} paused hand-off(s) back in the inbox in their order"
         + (f": {', '.join(p.name for p in moved)}" if moved else ""), agent=paths.agent)
    return EXIT_OK


def build_parser() -> argparse.ArgumentParser:
    """The argument parser (every default stated in the help)."""
    p = argparse.ArgumentParser(
        prog="fleet-runner",
        description="Serve one agent's inbox: run each task through the agent command, verify "
                    "it with deterministic gates, retry a bounded number of times, escalate.")
    p.add_argument("--agent", required=True, help="the agent's name")
    p.add_argument("--root", default=os.environ.get("FLEET_ROOT"),
                   help="the host's managed root (default: $FLEET_ROOT)")
    p.add_argument("--release", help="release directory (default: ROOT/current)")
    p.add_argument("--config", help="agent config (default: RELEASE/agents/AGENT/agent.yaml)")
    p.add_argument("--state-dir", help="state directory (default: ROOT/state/AGENT)")
    p.add_argument("--workspace", help="workspace (default: ROOT/workspace/AGENT)")
    p.add_argument("--outbox", help="reply spool (default: STATE/outbox)")
    p.add_argument("--notify-spool", help="escalation spool (default: STATE/notify)")
    p.add_argument("--once", action="store_true",
                   help="exit 0 once the inbox is empty instead of waiting for messages")
    p.add_argument("--poll-s", type=float, default=1.0,
                   help="seconds between looks at an empty inbox (default: 1)")
    p.add_argument("--kill-grace-s", type=float, default=5.0,
                   help="seconds between SIGTERM and SIGKILL to a process group (default: 5)")
    p.add_argument("--check-timeout-s", type=float, default=300.0,
                   help="wall-clock seconds for the check command (default: 300)")
    p.add_argument("--sync-retry-s", type=float, default=60.0,
                   help="seconds before a task whose sync's fetch failed is tried again, "
                        "doubled at each failure up to 900 (default: 60)")
    p.add_argument("--retry-backoff-s", type=float, default=5.0,
                   help="seconds before the retry that follows a failed verification, doubled "
                        "at each further failure up to 120; 0: at once (default: 5)")
    p.add_argument("--agent-user", metavar="USER",
                   help="run the agent command and the checks as USER, apart from the runner: "
                        "sends then count only when recorded through the runner's socket "
                        "(the runner must be root, with the capabilities docs/runner.md lists; "
                        "default: the runner's user)")
    p.add_argument("--list-denials", action="store_true",
                   help="print the agent's standing denials as JSON, and exit")
    p.add_argument("--clear-denial", metavar="PERMISSION",
                   help="clear the standing denial of PERMISSION (as listed; 'all': every "
                        "one) so new tasks start again, and exit")
    p.add_argument("--list-commands", action="store_true",
                   help="print the threads a person is in command of (with their paused "
                        "hand-offs) as JSON, and exit")
    p.add_argument("--clear-command", metavar="THREAD",
                   help="the person's action: clear the person-in-command flag of THREAD, so "
                        "its paused hand-offs resume in their order, and exit")
    p.add_argument("--show-prefix", action="store_true",
                   help="print the prompt prefix and its estimated tokens as JSON, and exit")
    return p


def _hold_lock(path: Path) -> int | None:
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return None
    os.ftruncate(fd, 0)
    os.write(fd, f"{os.getpid()}\n".encode())
    return fd  # held until the process ends (kept open across exec: see _reexec)


def _show_prefix(paths: AgentPaths) -> int:
    config = load_config(paths.config)
    prefix = build_prefix(config.prompt, config.skills, paths.skills,
                          bridged_servers=config.bridged_servers)
    tokens, counter, exact = counted_prefix(prefix.components,
                                            paths.config.parent / "prefix-tokens.json")
    json.dump({"agent": config.agent, "components": prefix.components, "text": prefix.text,
               "tokens": tokens, "tokens_total": sum(tokens.values()),
               "token_counter": counter, "tokens_exact": exact,
               "budget_tokens": config.budget_tokens}, sys.stdout, indent=1)
    print()
    return EXIT_OK


def _reexec(paths: AgentPaths, argv: list[str], lock_fd: int) -> None:
    entry = Path(os.path.realpath(paths.release)) / "runner" / "bin" / "fleet-runner"
    os.set_inheritable(lock_fd, False)  # the new image takes the lock itself
    os.close(lock_fd)
    os.execv(sys.executable, [sys.executable, os.fspath(entry), *argv])


def main(argv: list[str] | None = None) -> int:
    """Run the command line; return the exit status."""
    argv = sys.argv[1:] if argv is None else argv
    args = build_parser().parse_args(argv)
    if not _AGENT_NAME.fullmatch(args.agent):
        _say(f"--agent {args.agent!r}: letters, digits, '.', '_' or '-' (as in "
             "the inventory)")
        return EXIT_ERROR
    if not args.root:
        _say("--root is required (or set FLEET_ROOT)")
        return EXIT_ERROR
    paths = agent_paths(args.agent, Path(args.root), release=args.release, config=args.config,
                        state=args.state_dir, workspace=args.workspace, outbox=args.outbox,
                        notify=args.notify_spool)
    if args.list_denials or args.clear_denial:
        return _denials(paths, args.clear_denial)
    if args.list_commands or args.clear_command:
        return _command(paths, args.clear_command)
    refusal = not_root_refusal(args.agent_user) if args.agent_user else None
    if refusal:  # before the lock: a non-root runner may not even reach root's state
        _say(refusal)
        return EXIT_ERROR
    try:
        if args.show_prefix:
            return _show_prefix(paths)
        # Fail fast, before a message is claimed: a config no task could run with stops the
        # runner here (exit 2), not on the first message (which would then wait in processing/).
        check_servable(load_config(paths.config), args.agent, paths.skills)
    except (ConfigError, PrefixError) as exc:
        _say(str(exc))
        return EXIT_ERROR
    try:
        paths.ensure()
    except OSError as exc:
        _say(f"cannot create the state or workspace directories: {exc}")
        return EXIT_ERROR
    try:
        lock_fd = _hold_lock(paths.lock)
    except OSError as exc:
        _say(f"cannot take the runner's lock {paths.lock}: {exc.strerror} (the "
             f"state directory {paths.state} must be this runner's: uid {os.geteuid()})")
        return EXIT_ERROR
    if lock_fd is None:
        _say(f"another runner serves agent {args.agent} ({paths.lock} is locked)")
        return EXIT_LOCKED
    become_subreaper()
    owner = cgroup.owner_key(args.agent, paths.state)
    cgroup.set_owner(owner)
    for swept in cgroup.sweep(owner):  # run cgroups an earlier runner left behind
        _say(f"removed the run cgroup {swept['cgroup']} of a runner that is gone "
             f"({len(swept['killed'])} process(es) killed in it)", agent=args.agent)
    runner = Runner(paths, RunnerOptions(kill_grace_s=args.kill_grace_s,
                                         check_timeout_s=args.check_timeout_s,
                                         poll_s=args.poll_s,
                                         sync_retry_s=args.sync_retry_s,
                                         retry_backoff_s=args.retry_backoff_s))
    if args.agent_user:
        try:
            runner.split_users(args.agent_user)
        except (RunnerError, OSError) as exc:
            _say(str(exc))
            return EXIT_ERROR
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: runner.request_stop())
    started_release = os.path.realpath(paths.release)
    follow = args.release is None  # an explicit --release is never swapped under the runner
    try:
        how = runner.serve(once=args.once, release_changed=(
            (lambda: os.path.realpath(paths.release) != started_release) if follow else None))
    except RunnerError as exc:
        _say(str(exc))
        return EXIT_ERROR
    if how == "release-changed":
        runner.log(f"current now points at {os.path.realpath(paths.release)}; restarting into it")
        _reexec(paths, argv, lock_fd)
    return EXIT_OK

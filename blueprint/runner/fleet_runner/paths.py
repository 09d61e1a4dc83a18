"""Where one agent's files are on its host.

The release (read-only for the runner) and the agent's runtime state are kept apart: a ship
replaces the release tree as a whole and never touches the state, and drift never reports it.

Defaults, each overridable on the command line (tests point them at temporary directories)::

    <root>/current/                        the release in use (--release)
        agents/<agent>/agent.yaml          the agent's config (--config)
        skills/<name>/{SKILL.md,bin/}      the skills and their CLIs
        runner/                            this program
    <root>/state/<agent>/                  runtime state, mode 0700 (--state-dir)
        inbox/                             messages waiting (one JSON file each)
        processing/                        the message being worked on (at most one)
        done/  failed/                     finished messages
        outbox/                            replies the reply CLI sends (the chat bridge reads it)
        notify/                            escalations the notify CLI sends (the pager reads it)
        sends.jsonl  denials.jsonl         what the CLIs record for the runner (evidence.py)
        ledger.jsonl                       one line per model turn (records.py)
        in-progress.json                   the task under way in the working repository
        sync-in-progress.json              a sync under way in it (reposync.py)
        sync-leftover.json                 what the last task left uncommitted (reposync.py)
        runs/<task>/                       the task's sentinel, run records, prompts, output
        team/                              the team's files: flags, paused hand-offs (team.py)
        lock                               held while a runner serves this agent
    <root>/workspace/<agent>/              the agent's working directory, mode 0700 (--workspace)
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

STATE_DIRS = ("inbox", "processing", "done", "failed", "outbox", "notify", "runs")


@dataclass(frozen=True, slots=True)
class AgentPaths:
    """Every path the runner uses for one agent (see the module docstring for the layout).

    Attributes:
        agent: the agent's name.
        root: the host's managed root.
        release: the release directory (``<root>/current`` unless given).
        config: the agent's ``agent.yaml``.
        state: the agent's state directory.
        workspace: the agent's workspace.
        outbox: the reply spool (``<state>/outbox`` unless given).
        notify: the escalation spool (``<state>/notify`` unless given).
    """

    agent: str
    root: Path
    release: Path
    config: Path
    state: Path
    workspace: Path
    outbox: Path
    notify: Path

    @property
    def skills(self) -> Path:
        """``<release>/skills``."""
        return self.release / "skills"

    @property
    def inbox(self) -> Path:
        """Messages waiting."""
        return self.state / "inbox"

    @property
    def processing(self) -> Path:
        """The message being worked on."""
        return self.state / "processing"

    @property
    def done(self) -> Path:
        """Messages whose task passed verification."""
        return self.state / "done"

    @property
    def failed(self) -> Path:
        """Messages whose task gave up, was denied, or was invalid."""
        return self.state / "failed"

    @property
    def runs(self) -> Path:
        """Per-task records: ``runs/<task>/``."""
        return self.state / "runs"

    @property
    def ledger(self) -> Path:
        """The token ledger, one JSON line per model turn."""
        return self.state / "ledger.jsonl"

    @property
    def sends_log(self) -> Path:
        """Where the reply CLI records each send."""
        return self.state / "sends.jsonl"

    @property
    def denials_log(self) -> Path:
        """Where CLIs record a refused permission."""
        return self.state / "denials.jsonl"

    @property
    def standing_denials(self) -> Path:
        """One file per permission refused and not yet cleared (standing.py)."""
        return self.state / "standing-denials"

    @property
    def in_progress(self) -> Path:
        """The in-progress sentinel of a task in a synced repository (reposync.py)."""
        return self.state / "in-progress.json"

    @property
    def sync_sentinel(self) -> Path:
        """The sentinel of a sync under way in the working repository (reposync.py)."""
        return self.state / "sync-in-progress.json"

    @property
    def sync_leftover(self) -> Path:
        """What the last task left uncommitted in the synced repository (reposync.py)."""
        return self.state / "sync-leftover.json"

    @property
    def synced_upstream(self) -> Path:
        """The remote branch's commit at the last sync that went through (reposync.py): out
        of the agent's reach, unlike the workspace's remote-tracking ref."""
        return self.state / "sync-upstream.json"

    @property
    def team(self) -> Path:
        """The team's files: ``command/``, ``paused/``, ``refused.jsonl`` ... (team.py)."""
        return self.state / "team"

    @property
    def lock(self) -> Path:
        """Held (flock) by the runner serving this agent."""
        return self.state / "lock"

    def ensure(self) -> None:
        """Create the state directories and the workspace (0700) if missing."""
        for path in (self.state, *(self.state / d for d in STATE_DIRS), self.outbox, self.notify,
                     self.workspace):
            os.makedirs(path, mode=0o700, exist_ok=True)


def agent_paths(agent: str, root: Path, release: Path | None = None, config: Path | None = None,
                state: Path | None = None, workspace: Path | None = None,
                outbox: Path | None = None, notify: Path | None = None) -> AgentPaths:
    """Resolve one agent's paths; ``None`` means the default under ``root`` (module docstring)."""
    root = Path(os.path.abspath(root))
    release = Path(os.path.abspath(release)) if release else root / "current"
    state = Path(os.path.abspath(state)) if state else root / "state" / agent
    config = Path(os.path.abspath(config)) if config else release / "agents" / agent / "agent.yaml"
    return AgentPaths(
        agent=agent,
        root=root,
        release=release,
        config=config,
        state=state,
        workspace=Path(os.path.abspath(workspace)) if workspace else root / "workspace" / agent,
        outbox=Path(os.path.abspath(outbox)) if outbox else state / "outbox",
        notify=Path(os.path.abspath(notify)) if notify else state / "notify",
    )

"""Who owns what in the state directory when the agent runs as its own user (``--agent-user``).

A state directory written while runner and agent were one user (a host upgraded from a unit that
ran the runner as the agent's user) holds the records, the ledger, the spools and the evidence
files owned by the agent's user: the agent could still open them by name and rewrite them,
0711 on ``STATE`` notwithstanding. So before the runner serves with two users it takes the
state back: every entry under ``STATE`` becomes the runner's, except the agent's own
directories (``STATE/agent/``, the outbox and notify spools, and everything in them), which
become the agent user's. Symlinks are re-owned as links (``lchown``) and never followed, and
the runner's files and directories lose group and other write permission.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterable
from pathlib import Path


def claim_state(state: Path, agent_dirs: Iterable[Path], runner_ids: tuple[int, int],
                agent_ids: tuple[int, int]) -> list[str]:
    """Re-own everything under ``state`` (module docstring).

    Args:
        state: the state directory (itself becomes the runner's).
        agent_dirs: directories that are the agent user's with all they hold; those outside
            ``state`` are left alone (the caller owns them).
        runner_ids: ``(uid, gid)`` of the runner.
        agent_ids: ``(uid, gid)`` of the agent's user.

    Returns:
        The paths (relative to ``state``, ``"."`` for itself) whose owner or mode was changed,
        sorted.

    Raises:
        OSError: an entry could not be re-owned (the runner needs root or ``CAP_CHOWN``).
    """
    theirs = {os.path.abspath(d) for d in agent_dirs}
    changed: list[str] = []

    def own(path: str, ids: tuple[int, int], for_agent: bool) -> None:
        st = os.lstat(path)
        touched = False
        if (st.st_uid, st.st_gid) != ids:
            os.lchown(path, *ids)
            touched = True
        # Not a link (its mode means nothing) nor a socket (the runner's evidence socket is
        # 0666 by design: made again at startup).
        plain = stat.S_ISREG(st.st_mode) or stat.S_ISDIR(st.st_mode)
        if not for_agent and plain and st.st_mode & 0o022:
            os.chmod(path, stat.S_IMODE(st.st_mode) & ~0o022)
            touched = True
        if touched:
            changed.append(os.path.relpath(path, state))

    def walk(top: str, for_agent: bool) -> None:
        own(top, agent_ids if for_agent else runner_ids, for_agent)
        if not stat.S_ISDIR(os.lstat(top).st_mode):
            return
        with os.scandir(top) as entries:
            for entry in entries:
                mine = for_agent or entry.path in theirs
                if entry.is_dir(follow_symlinks=False):
                    walk(entry.path, mine)
                else:
                    own(entry.path, agent_ids if mine else runner_ids, mine)

    walk(os.path.abspath(state), False)
    return sorted(changed)

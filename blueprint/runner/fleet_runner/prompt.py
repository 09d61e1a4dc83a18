"""The task prompt: what follows the prefix on stdin for one attempt.

Its parts, in order: the task header (id, attempt of how many, sender, channel, reply-to); the
message text; for a task from a human that has no recorded reply yet, the anti-silence
instruction (the final text is not delivered; the reply must be sent with the reply CLI); a note
when an earlier attempt was interrupted by a runner restart; the commits earlier attempts left
in a synced working repository (continue from them, do not redo them); and, after a failed
verification, the failed gates' raw output ("fix exactly this").
"""

from __future__ import annotations

from collections.abc import Sequence

from fleet_runner.gates import GateResult, reply_command
from fleet_runner.handoff import Handoff, Result
from fleet_runner.inbox import Message
from fleet_runner.records import head_text

FEEDBACK_MAX_BYTES = 16_000
"""Raw gate output fed back per failed gate, in bytes."""


def anti_silence_instruction(task: str, channel: str | None) -> str:
    """The explicit instruction added for an unanswered human message."""
    return ("IMPORTANT: a person is waiting for an answer. Your final text is NOT delivered to "
            "anyone: the person sees only what you send with the reply CLI. Send your answer "
            f"with: {reply_command(task, channel)}")


def team_lines(team: Handoff | Result) -> list[str]:
    """The prompt's header and text for a hand-off (the brief, what is expected back, the
    deadline, who asks) or a result (its state, summary and claimed files)."""
    chain = (f"thread {team.thread}, root task {team.root_task}, hop {team.hops} of "
             f"{team.hop_budget}")
    where = f"; the person's channel is {team.channel}" if team.channel else ""
    if isinstance(team, Handoff):
        return [f"From: agent {team.producer.agent} on host {team.producer.host}: a hand-off "
                f"({chain}{where})",
                f"Expected back: {team.expected}",
                f"Deadline: {team.deadline}",
                f"When you finish, the runner sends your result back to "
                f"{team.producer.agent}; say what you found or did in your final summary.",
                "Brief:\n" + team.brief]
    files = ", ".join(team.files) if team.files else "(none)"
    return [f"From: agent {team.producer.agent} on host {team.producer.host}: the result of "
            f"your hand-off {team.id} ({chain}{where})",
            f"State: {team.state}" + (f" (its runner's outcome: {team.outcome})"
                                      if team.outcome else ""),
            f"Files it says it touched: {files}",
            "Summary:\n" + team.summary]


def build_task_prompt(message: Message, attempt: int, max_attempts: int, *,
                      replied: int = 0, interrupted: bool = False,
                      failed_gates: Sequence[GateResult] = (),
                      failed_attempt: int | None = None,
                      prior_commits: Sequence[str] = (), branch: str | None = None,
                      since: str | None = None, writes: Sequence[str] | None = None,
                      granted: Sequence[str] = (), scope_file: str | None = None) -> str:
    """Build the task prompt of one attempt.

    Args:
        message: the task's message.
        attempt: this attempt's number (1-based).
        max_attempts: ``max_retries + 1``.
        replied: sends already recorded for the task.
        interrupted: the previous attempt was cut short by a runner restart.
        failed_gates: the previous attempt's failed gates (empty on a first attempt).
        failed_attempt: the number of the attempt they belong to.
        prior_commits: ``"<short id> <subject>"`` of the commits earlier attempts of this task
            left on the branch, oldest first (:func:`fleet_runner.reposync.commits_since`).
        branch: the synced branch they are on.
        since: the short id of the commit the task started from.
        writes: the role's write scope (gitignore patterns), or ``None`` (not limited: no
            scope section).
        granted: paths granted on request so far (:mod:`fleet_runner.scoperequest`).
        scope_file: where a scope request is written (``$FLEET_SCOPE_REQUEST``).
    """
    sender = f"{message.sender_kind} {message.sender_name}"
    where = f" in channel {message.channel}" if message.channel else ""
    parts = [f"## Task {message.id} (attempt {attempt} of {max_attempts})"]
    if message.team is not None:
        parts.extend(team_lines(message.team))
    else:
        parts.extend([f"From: {sender}{where}"
                      + (f" (in reply to {message.reply_to})" if message.reply_to else ""),
                      "Message:\n" + message.text])
    if message.human and not replied:
        parts.append(anti_silence_instruction(message.id, message.channel))
    elif message.human:
        parts.append(f"You have already sent {replied} reply(ies) for this task with the reply "
                     "CLI; send another only if the person needs to know something new.")
    if writes is not None:
        allowed = ", ".join(writes) if writes else "(nothing)"
        parts.append(
            f"Write scope: you may change only {allowed} (gitignore patterns, relative to the "
            "workspace)" + (f", and the paths granted on request: {', '.join(granted)}"
            if granted else "") + ". The runner undoes any other change. To ask for more, "
            f"before writing, put JSON in {scope_file or '$FLEET_SCOPE_REQUEST'}: "
            '{"paths": ["a/b.txt"], "why": "..."} (literal paths, no wildcards) and finish; '
            "a path this task already changed is never granted, and a grant counts from the "
            "next attempt.")
    if interrupted:
        parts.append("NOTE: the previous attempt of this task was interrupted (the runner "
                     "restarted). The workspace may hold its partial work: look at it and finish "
                     "the task from there rather than starting over.")
    if prior_commits:
        first, last = prior_commits[0].split()[0], prior_commits[-1].split()[0]
        parts.append(
            f"NOTE: a previous attempt of this task left {len(prior_commits)} commit(s), "
            f"{first} to {last}, on {branch or 'the branch'} (git log {since}..HEAD), oldest "
            "first:\n"
            + "".join(f"  - {c}\n" for c in prior_commits)
            + "They are this task's partial work: continue from them. Do not reset, rebase or "
            "redo them.")
    if failed_gates:
        lines = [f"## Verification failed on attempt {failed_attempt}",
                 "You finished but verification failed: fix exactly this."]
        for gate in failed_gates:
            lines.append(f"### gate {gate.name}: {gate.summary}")
            if gate.output:
                lines.append(head_text(gate.output, FEEDBACK_MAX_BYTES))
        parts.append("\n".join(lines))
    return "\n\n".join(parts) + "\n"

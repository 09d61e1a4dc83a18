"""Shared by the scripted fake agents: read the prompt, log what happened, act in the workspace.

Every fake agent reads its whole prompt from stdin first (it would hang if the runner left stdin
open), then appends one JSON line per event to $FAKE_AGENT_LOG, the test's own record of what
the agent saw and did, independent of the runner's records.
"""
import json
import os
import subprocess
import sys
import time


def log(event, **fields):
    """Append one event to $FAKE_AGENT_LOG."""
    record = {"event": event, "time": time.time(), "pid": os.getpid(), "pgid": os.getpgid(0),
              "task": os.environ.get("FLEET_TASK_ID"), "attempt": os.environ.get("FLEET_ATTEMPT"),
              **fields}
    with open(os.environ["FAKE_AGENT_LOG"], "a", encoding="utf-8") as fh:
        fh.write(json.dumps(record) + "\n")


def start():
    """Read the prompt to end of file and log the start (with the prompt and some env)."""
    prompt = sys.stdin.read()
    log("start", prompt=prompt, cwd=os.getcwd(), uid=os.getuid(),
        env={k: v for k, v in os.environ.items() if k.startswith("FLEET_") or k in ("PATH", "CI")},
        tty=os.isatty(0) or os.isatty(1) or os.isatty(2))
    return prompt


def write(rel, text):
    """Write a file in the workspace (the working directory)."""
    os.makedirs(os.path.dirname(rel) or ".", exist_ok=True)
    with open(rel, "w", encoding="utf-8") as fh:
        fh.write(text)


def run(*argv):
    """Run a CLI (found on the PATH the runner gave us); log and return its exit status."""
    done = subprocess.run(list(argv), capture_output=True, text=True)
    log("cli", argv=list(argv), status=done.returncode, stdout=done.stdout, stderr=done.stderr)
    return done.returncode

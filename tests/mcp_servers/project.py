"""Small fleet projects for the ``fleetctl tokens`` tests: a blueprint with the repository's own
runner prefix builder, skills, roles (dicts, written as YAML) and a local inventory."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[2]
SERVER = ["{python}", "-m", "tests.mcp_servers.tracker"]
SNAPSHOT = REPO / "tests" / "mcp_servers" / "tracker.tools.json"
TRACKER_ENV = {"PYTHONPATH": str(REPO)}


def tracker(*args: str, **settings: Any) -> dict[str, Any]:
    """A role's declaration of the test tracker server over stdio, with ``args`` after it."""
    return {"command": [*SERVER, *args], "env": dict(TRACKER_ENV), **settings}


def make_tokens_project(base: Path, roles: dict[str, dict[str, Any]],
                        agents: dict[str, str] | None = None,
                        skills: dict[str, str] | None = None) -> tuple[Path, Path]:
    """Create ``base/blueprint`` and ``base/inventory.yaml``; return ``(inventory, blueprint)``.

    Args:
        roles: role name → the role file's mapping.
        agents: agent name → role (one host ``h1``); default one agent per role, named as it.
        skills: skill name → summary; each gets a ``SKILL.md`` and a ``bin/<name>`` CLI.
            Default ``reply`` only; ``mcp-bridge`` is always copied from the repository.
    """
    bp = base / "blueprint"
    runner = bp / "runner" / "fleet_runner"
    runner.mkdir(parents=True)
    shutil.copy(REPO / "blueprint" / "runner" / "fleet_runner" / "prefix.py", runner / "prefix.py")
    for name, summary in (skills or {"reply": "Send your answer to the person who asked."}).items():
        (bp / "skills" / name / "bin").mkdir(parents=True)
        (bp / "skills" / name / "SKILL.md").write_text(f"---\nname: {name}\nsummary: {summary}\n"
                                                        "---\n# body, not in the prefix\n")
        (bp / "skills" / name / "bin" / name).write_text("#!/bin/sh\n")
    shutil.copytree(REPO / "blueprint" / "skills" / "mcp-bridge", bp / "skills" / "mcp-bridge")
    (bp / "roles").mkdir()
    for name, body in roles.items():
        (bp / "roles" / f"{name}.yaml").write_text(yaml.safe_dump(body, sort_keys=False))
    inventory = base / "inventory.yaml"
    agents = agents or {name: name for name in roles}
    inventory.write_text(yaml.safe_dump({"hosts": {"h1": {
        "transport": "local", "root": str(base / "box"),
        "agents": {a: {"role": r} for a, r in agents.items()}}}}))
    return inventory, bp


PYTHON = sys.executable

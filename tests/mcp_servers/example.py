"""The example in docs/tokens.md: a triage role that declares the issue-tracker MCP server, audited
with ``--compare mcp`` (as declared versus through the ``mcp-bridge`` CLI).

    python -m tests.mcp_servers.example [fleetctl tokens options...]

copies the repository's blueprint into a temporary directory, adds the role below (the tracker is
started for real over stdio, with the official MCP SDK) and one agent using it, and runs
``fleetctl tokens triager --compare mcp`` there with the options given. The numbers in
docs/tokens.md are its output.
"""

from __future__ import annotations

import shutil
import sys
import tempfile
from pathlib import Path

import typer
import yaml

from tests.mcp_servers.project import REPO, tracker

ROLE = {
    "description": "Triages incoming issues in the tracker.",
    "prompt": ("You are the triager. For each new issue: search for duplicates, set its priority "
               "and state, label it, and comment why. Report what you did with `reply`.\n"),
    "skills": ["reply", "notify"],
    "capabilities": ["chat-post"],
    "budget_tokens": 9000,
    "max_tool_tokens": 600,
    "mcp_servers": {"tracker": tracker()},
}


def build(base: Path) -> tuple[Path, Path]:
    """The example project under ``base``: ``(inventory, blueprint)``."""
    blueprint = base / "blueprint"
    shutil.copytree(REPO / "blueprint", blueprint)
    (blueprint / "roles" / "triager.yaml").write_text(yaml.safe_dump(ROLE, sort_keys=False))
    inventory = base / "inventory.yaml"
    inventory.write_text(yaml.safe_dump({"hosts": {"alpha": {
        "transport": "local", "root": str(base / "alpha"),
        "agents": {"triager": {"role": "triager"}}}}}))
    return inventory, blueprint


def main(argv: list[str]) -> int:
    from fleetctl.cli.tokens import tokens_command

    app = typer.Typer(add_completion=False, pretty_exceptions_enable=False)
    app.callback()(lambda: None)
    app.command("tokens")(tokens_command)
    with tempfile.TemporaryDirectory() as tmp:
        inventory, blueprint = build(Path(tmp))
        try:
            app(["tokens", "triager", "--compare", "mcp", "--inventory", str(inventory),
                 "--blueprint", str(blueprint), *argv], prog_name="fleetctl")
        except SystemExit as done:
            return int(done.code or 0)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

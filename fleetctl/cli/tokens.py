"""``fleetctl tokens [AGENT...]``: the prompt-prefix audit, as a thin command.

It parses options, calls :func:`fleetctl.tokens.audit.audit_tokens`, renders the report and exits
0 (every agent within its budgets), 1 (over a budget, a ceiling or the baseline's growth
threshold) or 2 (bad input, or an MCP server that could not be measured). With ``--live`` it
summarises the runners' ledgers read from the hosts instead
(:func:`fleetctl.tokens.live.live_tokens`): exit 0, or 2 when a host or a ledger could not be
read. Added to the main app by :func:`register`; the reports are rendered by
:mod:`fleetctl.cli.output.tokens` and :mod:`fleetctl.cli.output.tokens_live`.

Shared pieces (formats, the stderr console, finding the project) come from
:mod:`fleetctl.cli.common`.
"""

from __future__ import annotations

import sys
from enum import Enum
from pathlib import Path

import typer
from rich.console import Console

from fleetctl.cli.common import (
    BlueprintOpt,
    DebugOpt,
    Format,
    FormatOpt,
    InventoryOpt,
    OutputOpt,
    find_project,
    guard,
    inventory_path,
)


class CompareWith(str, Enum):
    mcp = "mcp"
    default = "default"


class CounterName(str, Enum):
    o200k = "o200k"
    claude_api = "claude-api"


def _never_crash_on_encoding() -> None:
    """Keep output from crashing where stdout or stderr cannot encode a character (an ASCII
    locale, ``PYTHONIOENCODING=ascii``): such characters are written as escapes instead."""
    for stream in (sys.stdout, sys.stderr):
        encoding = (getattr(stream, "encoding", None) or "").lower().replace("-", "")
        if encoding != "utf8" and hasattr(stream, "reconfigure"):
            try:
                stream.reconfigure(errors="backslashreplace")
            except (ValueError, OSError):  # a stream that cannot change: left as it is
                pass


def tokens_command(
    agents: list[str] | None = typer.Argument(
        None, help="Agents to audit, by name or HOST/AGENT \\[default: all]."),
    compare: CompareWith | None = typer.Option(
        None, "--compare", help="mcp: also measure each role with its MCP servers behind the "
                                "mcp-bridge CLI, and show the saving. default: also measure it "
                                "as its harness runs by default (every built-in tool, every MCP "
                                "server mounted): before and after, per component."),
    baseline: Path | None = typer.Option(
        None, "--baseline", help="A previous `--format json` report: fail on growth beyond "
                                 "--max-growth and name what grew."),
    max_growth: float = typer.Option(
        5.0, "--max-growth", min=0.0, help="Percent growth of a prefix over the baseline that "
                                           "is a finding."),
    counter: CounterName = typer.Option(
        CounterName.o200k, "--counter", help="o200k: exact o200k_base counts, offline. "
                                             "claude-api: Claude's count_tokens (needs "
                                             "$ANTHROPIC_API_KEY), measured as deltas."),
    claude_model: str | None = typer.Option(
        None, "--claude-model", help="Model for --counter claude-api when a role sets none "
                                     "\\[default: claude-sonnet-4-5]."),
    live: bool = typer.Option(False, "--live", help="Read the runners' ledgers from the hosts "
                                                    "and summarise the turns per agent."),
    probe: bool = typer.Option(False, "--probe", help="Run each selected agent's harness "
                                                      "against a local endpoint and write its "
                                                      "profiles into the blueprint."),
    harness_bin: Path | None = typer.Option(
        None, "--harness-bin", help="With --probe: the harness executable to run instead of "
                                    "agent_command's first word."),
    startup_timeout: float | None = typer.Option(
        None, "--startup-timeout", min=0.1, help="Seconds every MCP server may take to start, "
                                                 "when longer than its role's startup_timeout_s "
                                                 "(a slow server)."),
    probe_timeout: float = typer.Option(
        60.0, "--probe-timeout", min=1.0, help="With --probe: seconds a harness may take."),
    since: str | None = typer.Option(
        None, "--since", help="With --live: only turns that ended after this ISO 8601 time."),
    parallel: int = typer.Option(8, "--parallel", "-p", min=1,
                                 help="With --live: hosts at once."),
    inventory: Path | None = InventoryOpt,
    blueprint: Path | None = BlueprintOpt,
    fmt: Format = FormatOpt,
    output: Path | None = OutputOpt,
    debug: bool = DebugOpt,
) -> None:
    """Measure each agent's prompt prefix against its budgets (exit 0 within, 1 over, 2 error)."""
    from fleetctl.errors import InputError

    _never_crash_on_encoding()

    def body() -> int:
        if live and (compare is not None or baseline is not None):
            raise InputError("--live reads the ledgers on the hosts: it takes no --compare or "
                             "--baseline")
        if since is not None and not live:
            raise InputError("--since is for --live")
        if probe and (live or compare is not None or baseline is not None):
            raise InputError("--probe measures the harnesses: it takes no --live, --compare "
                             "or --baseline")
        if harness_bin is not None and not probe:
            raise InputError("--harness-bin is for --probe")
        target = None
        if output is not None:
            try:
                target = open(output, "w", encoding="utf-8")  # noqa: SIM115 - closed below
            except OSError as exc:
                raise InputError(f"{output}: cannot write the report: {exc.strerror}") from None
        from fleetctl.tokens.audit import TokensOptions, audit_tokens

        inventory_file = inventory_path(inventory)
        project = find_project(inventory_file)
        if probe:
            from fleetctl.tokens.probe import probe_agents

            runs = probe_agents(inventory_file,
                                blueprint or project / "blueprint", tuple(agents or ()),
                                timeout_s=probe_timeout,
                                executable=str(harness_bin) if harness_bin else None)
        elif live:  # the ledgers on the hosts, not the prefix built here
            from fleetctl.tokens.live import live_tokens

            live_report = live_tokens(inventory_file,
                                      blueprint or project / "blueprint", tuple(agents or ()),
                                      since=since, parallel=parallel)
        else:
            options = TokensOptions(agents=tuple(agents or ()), counter=counter.value,
                                    compare_mcp=compare is CompareWith.mcp,
                                    compare_default=compare is CompareWith.default,
                                    startup_timeout_s=startup_timeout,
                                    baseline=baseline,
                                    max_growth_pct=max_growth, claude_model=claude_model)
            report = audit_tokens(inventory_file,
                                  blueprint or project / "blueprint", options)
        if probe:
            return _write_probe(runs, fmt, target)
        if live:
            return _write_live(live_report, fmt, target)
        return _write_audit(report, fmt, target)

    guard(body, debug)


def _write_live(report, fmt: Format, target) -> int:
    from fleetctl.cli.output.tokens_live import to_json, to_markdown, to_text

    fh = target or sys.stdout
    fh.write({Format.json: to_json, Format.markdown: to_markdown}.get(fmt, to_text)(report))
    fh.flush()
    if target is not None:
        target.close()
    return report.exit_code


def _write_audit(report, fmt: Format, target) -> int:
    from fleetctl.cli.output.tokens import print_text, to_json, to_markdown

    fh = target or sys.stdout
    if fmt is Format.json:
        fh.write(to_json(report))
    elif fmt is Format.markdown:
        fh.write(to_markdown(report))
    else:
        console = Console(file=fh, width=160, no_color=True) if target is not None else (
            Console() if Console().is_terminal else Console(width=160))
        print_text(console, report)
    fh.flush()
    if target is not None:
        target.close()
    return report.exit_code


def _write_probe(runs, fmt: Format, target) -> int:
    from fleetctl.cli.output.tokens import probe_json, probe_text

    fh = target or sys.stdout
    fh.write(probe_json(runs) if fmt is Format.json else probe_text(runs))
    fh.flush()
    if target is not None:
        target.close()
    return 1 if any(r.unexpected or r.missing for r in runs) else 0


def register(app: typer.Typer) -> None:
    """Add ``tokens`` to the main app."""
    app.command("tokens")(tokens_command)

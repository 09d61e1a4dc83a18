"""Which CLIs the agent called in one turn, counted by shims first on its PATH.

Before each attempt the runner writes a directory of shims, ``runs/<task>/attempt-N.shims/``:
one small ``/bin/sh`` script per CLI of the agent's CLI index (each file in the role's skills'
``bin/``, as :func:`fleet_runner.prefix.skill_clis` lists them, that is executable; when two
skills have a CLI of the same name the first skill's wins, as on the PATH). The directory goes
first on the agent's PATH, so the agent's own lookups of ``reply``, ``mcp-bridge`` and the
others reach the shim, which appends one line to the run's calls log
(``runs/<task>/attempt-N.calls``) and ``exec``s the real CLI by its absolute path with the same
arguments, stdin, stdout, stderr, environment and exit status. The CLIs need no cooperation, and
the shim records no argument but the MCP server and tool names below.

A line of the calls log is the CLI's name, and for ``mcp-bridge`` also the MCP server and tool
when the call names both (``mcp-bridge [--config FILE] SERVER TOOL ...`` or ``... SERVER --tool
TOOL ...``), tab-separated: ``mcp-bridge<TAB>tracker<TAB>create_issue``. A name that holds a tab
or a newline is recorded as ``?``. :func:`count_calls` turns the log into the ledger's
``calls`` (``{cli: count}``) and ``tool_calls`` (``{"server/tool": count}``).

What is counted is invocations, whatever their outcome (a ``--help`` lookup, a usage error or
a refusal included). Not counted: a CLI run by its absolute path (no PATH lookup), and the
runner's own escalations through ``notify`` (not part of a turn).
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Sequence
from pathlib import Path

from fleet_runner.prefix import skill_clis

MCP_BRIDGE = "mcp-bridge"
"""The CLI whose calls are also counted per MCP server and tool."""

_SHIM = """#!/bin/sh
# fleet-runner call shim: counts one call of {name} in this run, then runs the real CLI.
printf '%s\\n' {q_name} >>{q_log} 2>/dev/null
exec {q_real} "$@"
"""

# mcp-bridge's own grammar (its run()): an optional --config FILE or --config=FILE, then the
# server, then the tool as the next word or after --tool.
_BRIDGE_SHIM = """#!/bin/sh
# fleet-runner call shim: counts one call of mcp-bridge (and its MCP server and tool) in this
# run, then runs the real CLI.
_fleet_count() {{
  case ${{1-}} in --config) shift; [ $# -gt 0 ] && shift ;; --config=*) shift ;; esac
  server='' tool=''
  case ${{1-}} in
    -*|'') ;;
    *) server=$1; shift
       case ${{1-}} in --tool) tool=${{2-}} ;; -*|'') ;; *) tool=$1 ;; esac ;;
  esac
  case $server in *'\t'*|*'
'*) server='?' ;; esac
  case $tool in *'\t'*|*'
'*) tool='?' ;; esac
  if [ -n "$server" ] && [ -n "$tool" ]; then
    printf 'mcp-bridge\\t%s\\t%s\\n' "$server" "$tool"
  else
    printf 'mcp-bridge\\n'
  fi >>{q_log} 2>/dev/null
}}
_fleet_count "$@"
exec {q_real} "$@"
"""


def _quote(text: str) -> str:
    """``text`` as one single-quoted sh word."""
    return "'" + text.replace("'", "'\\''") + "'"


def write_shims(shim_dir: Path, calls_log: Path, skills: Sequence[str],
                skills_dir: Path) -> dict[str, str]:
    """Write one shim per CLI of the agent's CLI index into ``shim_dir`` (created, 0700) and
    create the empty ``calls_log``; return ``{cli name: real path}``.

    Raises:
        OSError: the directory or a shim cannot be written.
    """
    os.makedirs(shim_dir, mode=0o700, exist_ok=True)
    fd = os.open(calls_log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    os.close(fd)
    shimmed: dict[str, str] = {}
    for skill in skills:
        bin_dir = Path(skills_dir) / skill / "bin"
        for name in skill_clis(Path(skills_dir) / skill):
            real = os.fspath(bin_dir / name)
            if name in shimmed or not os.access(real, os.X_OK) or "/" in name:
                continue  # the first of a name wins, and a PATH lookup skips non-executables
            template = _BRIDGE_SHIM if name == MCP_BRIDGE else _SHIM
            text = template.format(name=name if name.isprintable() else "a CLI",
                               q_name=_quote(name), q_log=_quote(os.fspath(calls_log)),
                               q_real=_quote(real))
            path = Path(shim_dir) / name
            path.write_text(text, "utf-8")
            os.chmod(path, 0o700)
            shimmed[name] = real
    return shimmed


def remove_shims(shim_dir: Path) -> None:
    """Remove a run's shim directory (nothing if it is gone)."""
    shutil.rmtree(shim_dir, ignore_errors=True)


def count_calls(calls_log: Path) -> tuple[dict[str, int], dict[str, int]]:
    """The ledger's ``calls`` and ``tool_calls`` from a run's calls log (missing: both empty).

    Returns:
        ``({cli: count}, {"server/tool": count})``, each sorted by name.
    """
    calls: dict[str, int] = {}
    tools: dict[str, int] = {}
    try:
        with open(calls_log, encoding="utf-8", errors="replace") as fh:
            lines = fh.read().split("\n")  # not splitlines: U+2028 may be in a server name
    except OSError:
        return {}, {}
    for line in lines:
        fields = line.split("\t")
        if not fields[0]:
            continue
        calls[fields[0]] = calls.get(fields[0], 0) + 1
        if fields[0] == MCP_BRIDGE and len(fields) == 3:
            key = f"{fields[1]}/{fields[2]}"
            tools[key] = tools.get(key, 0) + 1
    return dict(sorted(calls.items())), dict(sorted(tools.items()))

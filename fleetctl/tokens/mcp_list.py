"""Listing an MCP server's tools: a real stdio server through the official SDK, or a snapshot.

A stdio server is started with the MCP Python SDK's ``stdio_client`` and ``ClientSession``:
``initialize`` (within the server's ``startup_timeout_s``), then ``tools/list`` page after page
(each within ``request_timeout_s``) until a page names no next cursor. The tools are kept exactly
as the server sent them (raw JSON objects), so what is measured is what the server offers.

Every way a server can fail to be measured has its own status, with the tail of its stderr, and
never yields an empty tool list that could pass for "no tools":

============== ===============================================================================
status         meaning
============== ===============================================================================
ok             every page listed
start-failed   the command could not be started (not found, not executable)
slow-start     no answer to ``initialize`` within ``startup_timeout_s``
crashed        the server closed its stdout (exited) before answering
non-json       the server wrote a line to stdout that is not a JSON-RPC message
timeout        no answer to a ``tools/list`` page within ``request_timeout_s``
cursor-loop    a page named a cursor already used: the listing would never end
too-many-pages more than :data:`MAX_PAGES` pages
protocol-error an error answer, or an answer that is not a valid ``tools/list`` result
bad-snapshot   the snapshot file is missing, not JSON, or not a ``tools/list`` result
============== ===============================================================================
"""

from __future__ import annotations

import errno
import json
import logging
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fleetctl.roledecl import McpServerDecl

MAX_PAGES = 1000
STDERR_TAIL_LINES = 20
STDERR_TAIL_BYTES = 4000

OK = "ok"
FAILURES = ("start-failed", "slow-start", "crashed", "non-json", "timeout", "cursor-loop",
            "too-many-pages", "protocol-error", "bad-snapshot")

# The SDK logs each unparsable stdout line with a traceback; the status reports it instead.
logging.getLogger("mcp").addHandler(logging.NullHandler())


@dataclass(frozen=True, slots=True)
class ServerListing:
    """What listing one MCP server gave.

    Attributes:
        name: the server's name in the role.
        status: ``ok`` or one of :data:`FAILURES`.
        source: ``stdio: <argv>`` or ``snapshot: <path>``.
        tools: the tools as the server listed them (complete only when ``status`` is ``ok``).
        instructions: the server's ``instructions``, or ``None``.
        pages: how many ``tools/list`` pages were read.
        detail: one line saying what happened (empty when ``ok``).
        stderr_tail: the last lines of the server's stderr (stdio servers).
        elapsed_s: seconds from start to the end of the listing.
        flags: problems with the tools that do not stop the measurement
            (:func:`fleetctl.tokens.toolchecks.check_tools`): a name listed twice (counted
            once), a name some providers reject, names that collide once normalised, an input
            schema whose root is ``anyOf``/``oneOf``/``allOf``.
        exit_status: the server's exit status when it exited before the listing ended (a
            crash), else ``None``.
    """

    name: str
    status: str
    source: str
    tools: tuple[dict[str, Any], ...] = ()
    instructions: str | None = None
    pages: int = 0
    detail: str = ""
    stderr_tail: str = ""
    elapsed_s: float = 0.0
    server_info: dict[str, Any] = field(default_factory=dict)
    flags: tuple[str, ...] = ()
    exit_status: int | None = None

    @property
    def measured(self) -> bool:
        """Whether every tool was listed."""
        return self.status == OK


def tail(text: str, lines: int = STDERR_TAIL_LINES, size: int = STDERR_TAIL_BYTES) -> str:
    """The last ``lines`` lines of ``text``, at most ``size`` characters."""
    kept = "\n".join(text.rstrip("\n").splitlines()[-lines:])
    return kept[-size:]


def _tools_of(result: Any, where: str) -> tuple[list[dict[str, Any]], str | None]:
    """The tools and next cursor of one ``tools/list`` result (raw JSON).

    Raises:
        ValueError: not a ``tools/list`` result.
    """
    if not isinstance(result, Mapping) or not isinstance(result.get("tools"), list):
        raise ValueError(f"{where}: not a tools/list result (no \"tools\" list)")
    tools = result["tools"]
    for i, tool in enumerate(tools):
        if not isinstance(tool, Mapping) or not isinstance(tool.get("name"), str):
            raise ValueError(f"{where}: tools[{i}] has no string \"name\"")
    cursor = result.get("nextCursor")
    if cursor is not None and not isinstance(cursor, str):
        raise ValueError(f"{where}: nextCursor is not a string")
    return [dict(t) for t in tools], cursor


def read_snapshot(name: str, path: Path) -> ServerListing:
    """A server's tools from a saved ``tools/list`` result (see :mod:`fleetctl.roledecl`)."""
    source = f"snapshot: {path}"
    try:
        data = json.loads(path.read_text("utf-8"))
    except OSError as exc:
        return ServerListing(name, "bad-snapshot", source, detail=f"cannot read: {exc.strerror}")
    except (UnicodeDecodeError, ValueError) as exc:
        return ServerListing(name, "bad-snapshot", source, detail=f"not JSON: {exc}")
    pages = data if isinstance(data, list) else [data]
    tools: list[dict[str, Any]] = []
    instructions = None
    try:
        for i, page in enumerate(pages):
            if isinstance(page, Mapping) and "result" in page and "tools" not in page:
                page = page["result"]  # a whole JSON-RPC response
            found, _ = _tools_of(page, f"page {i + 1}")
            tools.extend(found)
            if isinstance(page.get("instructions"), str):
                instructions = page["instructions"]
    except ValueError as exc:
        return ServerListing(name, "bad-snapshot", source, detail=str(exc))
    return ServerListing(name, OK, source, tools=tuple(tools), instructions=instructions,
                         pages=len(pages))


class _Failed(Exception):
    def __init__(self, status: str, detail: str) -> None:
        super().__init__(detail)
        self.status = status
        self.detail = detail


def _garbage_line(exc: BaseException) -> str:
    """The offending stdout line, from the SDK's parse error, shortened."""
    try:
        errors = exc.errors()  # type: ignore[attr-defined]
        value = errors[0].get("input")
        if isinstance(value, str):
            return value.strip()[:200]
    except Exception:  # noqa: BLE001 - best effort: the error's text below
        pass
    return str(exc).splitlines()[0][:200] if str(exc) else type(exc).__name__


def _leaves(group: BaseException) -> list[BaseException]:
    """The exceptions inside nested exception groups, depth first."""
    if isinstance(group, BaseExceptionGroup):  # noqa: F821 - Python 3.11+
        return [leaf for e in group.exceptions for leaf in _leaves(e)]
    return [group]


def expand_command(command: list[str]) -> list[str]:
    """``{python}`` in a command stands for the interpreter running fleetctl."""
    return [word.replace("{python}", sys.executable) for word in command]


async def _list_stdio(name: str, decl: McpServerDecl, base: Path) -> ServerListing:
    import anyio
    import mcp_types as types
    from mcp.client.session import ClientSession
    from mcp.client.stdio import StdioServerParameters, stdio_client
    from mcp.shared.exceptions import MCPError
    from pydantic import TypeAdapter, ValidationError

    argv = expand_command(decl.command or [])
    cwd = (base / decl.cwd) if decl.cwd else base
    source = "stdio: " + " ".join(decl.command or [])
    env = server_env(decl.env)
    if os.sep not in argv[0]:
        problem = None if shutil.which(argv[0], path=env.get("PATH")) else \
            "not found on PATH (or not executable)"
    else:
        path = cwd / argv[0]
        problem = (os.strerror(errno.ENOENT) if not path.exists() else
                   os.strerror(errno.EACCES) if not os.access(path, os.X_OK) else None)
    if problem is not None:
        return ServerListing(name, "start-failed", source,
                             detail=f"cannot start {argv[0]!r}: {problem}")
    # Through sh, which reports the server's exit status on stderr when it ends: a crash
    # then names its status. sh and the server share the session the SDK kills at the end.
    params = StdioServerParameters(command="/bin/sh",
                                   args=["-c", _REPORT_EXIT, "mcp-server", *argv], env=env,
                                   cwd=str(cwd))
    bad = anyio.Event()
    garbage: list[str] = []

    async def on_message(message: Any) -> None:
        if isinstance(message, Exception):
            garbage.append(_garbage_line(message))
            bad.set()

    async def guarded(call: Any, timeout_s: float, phase: str) -> Any:
        """Run ``call()``; fail on timeout, on a line that is not JSON-RPC, or a closed pipe."""
        out: dict[str, Any] = {}
        with anyio.move_on_after(timeout_s):
            async with anyio.create_task_group() as tg:
                async def watch() -> None:
                    await bad.wait()
                    tg.cancel_scope.cancel()

                tg.start_soon(watch)
                try:
                    out["value"] = await call()
                except Exception as exc:  # noqa: BLE001 - classified below
                    out["error"] = exc
                tg.cancel_scope.cancel()
        if garbage:
            raise _Failed("non-json", f"wrote a line that is not a JSON-RPC message to stdout "
                                      f"during {phase}: {garbage[0]!r}")
        if "error" in out:
            failure = out["error"]
            if isinstance(failure, MCPError) and "closed" in str(failure).lower():
                raise _Failed("crashed", f"the server closed its stdout (exited) during {phase}")
            if isinstance(failure, MCPError):
                raise _Failed("protocol-error", f"{phase} answered with an error: {failure}")
            if isinstance(failure, ValidationError):
                raise _Failed("protocol-error", f"{phase}: the answer is not valid: "
                                                f"{str(failure).splitlines()[0]}")
            raise failure
        if "value" not in out:
            status = "slow-start" if phase == "initialize" else "timeout"
            raise _Failed(status, f"no answer to {phase} within {timeout_s:g} s")
        return out["value"]

    started = time.monotonic()
    tools: list[dict[str, Any]] = []
    pages = 0
    instructions = None
    server_info: dict[str, Any] = {}
    status, detail = OK, ""
    with tempfile.TemporaryFile("w+", encoding="utf-8", errors="replace") as errlog:
        try:
            async with stdio_client(params, errlog=errlog) as (read, write):
                async with ClientSession(read, write, message_handler=on_message) as session:
                    init = await guarded(session.initialize, decl.startup_timeout_s,
                                         "initialize")
                    instructions = init.instructions
                    if init.server_info is not None:
                        server_info = init.server_info.model_dump(mode="json", exclude_none=True)
                    seen: set[str] = set()
                    cursor: str | None = None
                    while True:
                        request = types.ListToolsRequest(
                            params=types.PaginatedRequestParams(cursor=cursor) if cursor else None)
                        phase = f"tools/list page {pages + 1}"
                        result = await guarded(
                            # The raw result, not the SDK's model, so fields it does not know
                            # are measured too; the SDK accepts any validator at run time.
                            lambda r=request: session.send_request(
                                r, TypeAdapter(dict[str, Any])),  # type: ignore[type-var]
                            decl.request_timeout_s, phase)
                        pages += 1
                        try:
                            found, cursor = _tools_of(result, phase)
                        except ValueError as exc:
                            raise _Failed("protocol-error", str(exc)) from None
                        tools.extend(found)
                        if cursor is None:
                            break
                        if cursor in seen:
                            raise _Failed("cursor-loop", f"page {pages} names cursor {cursor!r} "
                                                         "again: the listing never ends")
                        if pages >= MAX_PAGES:
                            raise _Failed("too-many-pages", f"more than {MAX_PAGES} pages")
                        seen.add(cursor)
        except _Failed as exc:
            status, detail = exc.status, exc.detail
        except OSError as exc:
            status, detail = "start-failed", f"cannot start {argv[0]!r}: {exc.strerror or exc}"
        except BaseExceptionGroup as group:  # noqa: F821 - Python 3.11+
            leaves = _leaves(group)
            failed = [e for e in leaves if isinstance(e, _Failed)]
            oserr = [e for e in leaves if isinstance(e, OSError)]
            if failed:
                status, detail = failed[0].status, failed[0].detail
            elif oserr:
                status, detail = "start-failed", f"cannot start {argv[0]!r}: {oserr[0]}"
            else:
                first = leaves[0] if leaves else group
                status, detail = "protocol-error", f"{type(first).__name__}: {first}"
        errlog.seek(0)
        stderr_text, exit_status = _exit_status(errlog.read())
        stderr_tail = tail(stderr_text)
    if status == "crashed" and exit_status is not None:
        detail += f"; exit status {exit_status}" + (
            f" (killed by signal {exit_status - 128})" if exit_status > 128 else "")
    elif status == "slow-start":
        detail += (" (a slow server: raise its startup_timeout_s in the role, or pass "
                   "--startup-timeout SECONDS)")
    if status != "crashed":
        exit_status = None
    return ServerListing(name, status, source, tools=tuple(tools) if status == OK else (),
                         instructions=instructions, pages=pages, detail=detail,
                         stderr_tail=stderr_tail, elapsed_s=round(time.monotonic() - started, 3),
                         server_info=server_info, exit_status=exit_status)


_REPORT_EXIT = '"$@"; status=$?; echo "' + "{marker}" + '$status" >&2; exit $status'
EXIT_MARKER = "[fleetctl: the MCP server exited with status "
_REPORT_EXIT = _REPORT_EXIT.replace("{marker}", EXIT_MARKER)


def _exit_status(stderr: str) -> tuple[str, int | None]:
    """The server's stderr without the exit-status line the wrapper adds, and that status."""
    status = None
    kept = []
    for line in stderr.splitlines():
        if line.startswith(EXIT_MARKER):
            try:
                status = int(line[len(EXIT_MARKER):].strip().rstrip("]"))
            except ValueError:
                pass
            continue
        kept.append(line)
    return "\n".join(kept), status


UTF8_ENV = {"LANG": "C.UTF-8", "LC_ALL": "C.UTF-8", "PYTHONIOENCODING": "utf-8",
            "PYTHONUTF8": "1"}
"""What a server's environment gets unless its declaration sets it: UTF-8 everywhere, so a
tool description or stderr line outside ASCII never breaks a server started from an ASCII
locale (cron, systemd)."""


def server_env(declared: Mapping[str, str]) -> dict[str, str]:
    """A stdio server's environment: the SDK's default (``HOME``, ``PATH``, ``USER``...),
    :data:`UTF8_ENV`, then the role's ``env`` on top."""
    from mcp.client.stdio import get_default_environment

    return {**get_default_environment(), **UTF8_ENV, **dict(declared)}


def list_servers(servers: Mapping[str, McpServerDecl], base: Path) -> dict[str, ServerListing]:
    """List every server's tools; stdio servers run at the same time.

    Args:
        servers: name → declaration.
        base: the directory relative snapshot paths and ``cwd`` are resolved against (the
            blueprint).

    Returns:
        name → its listing, in the order given; a server that could not be measured has a
        status other than ``ok`` and no tools.
    """
    out: dict[str, ServerListing] = {}
    # A server with both a command and a snapshot is audited from its snapshot (offline).
    stdio = {n: d for n, d in servers.items() if d.command is not None and d.snapshot is None}
    for name, decl in servers.items():
        if decl.snapshot is not None:
            out[name] = read_snapshot(name, base / decl.snapshot)
    if stdio:
        import anyio

        async def run_all() -> dict[str, ServerListing]:
            results: dict[str, ServerListing] = {}
            async with anyio.create_task_group() as tg:
                async def one(n: str, d: McpServerDecl) -> None:
                    results[n] = await _list_stdio(n, d, base)

                for n, d in stdio.items():
                    tg.start_soon(one, n, d)
            return results

        out.update(anyio.run(run_all))
    from fleetctl.tokens.toolchecks import checked

    return {name: checked(out[name]) for name in servers}

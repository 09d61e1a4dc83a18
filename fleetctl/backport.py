"""Backport: bring hand-patched files from a live host into the blueprint's work tree.

``fleetctl backport HOST [PATH...]`` makes the blueprint authoritative again after a person
patched a host: each hand-patched file's live content (and executable bit) is written to the
blueprint file it was shipped from, a file added on the host is added beside its siblings, a file
deleted on the host is deleted; then the resulting ``git diff`` is shown. Nothing is committed:
the person reviews, commits and ships, and that ship needs no ``--force`` (live already equals
desired, so nothing of the hand-patch is lost).

Refused, with the reason and what to do instead:

- a file rendered from a template (``*.j2`` in the blueprint, or fleetctl's own templates for
  ``agents/``): its diff between the rendered output and the live file is shown, to fold in by
  hand;
- a credential file: named with the grant it comes from (secrets change at their source);
- a change git cannot carry (an owner, a mode other than 0644/0755, a mode declared in
  ``attributes.yaml``, a directory, a symlink to an absolute path).

The host is not trusted. Paths come from this side's own comparison (never a name the host
made up), are checked to be plain relative paths, and are written only inside the blueprint
directory: every directory on the way is opened without following symlinks, and files are
written to a temporary name and renamed (so a symlink planted in the blueprint is replaced,
never written through). Content read back is checked against the digest the scan saw.
"""

from __future__ import annotations

import errno
import os
import posixpath
import stat
import subprocess
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fleetctl.blueprint import Blueprint
from fleetctl.credentials import is_credential_path
from fleetctl.diffs import FileDiff, diff_contents, show_diff_line, split_lines
from fleetctl.drift import (
    CONFLICT,
    EXTRA,
    HAND_PATCH,
    MISSING,
    PENDING,
    UNKNOWN,
    Change,
)
from fleetctl.errors import HostError, InputError
from fleetctl.inventory import Host
from fleetctl.linesources import changed_lines, line_sources
from fleetctl.manifest import DIR, FILE, SYMLINK, sha256_digest
from fleetctl.names import escape_name, printable, safe_text, show_name, tree_path
from fleetctl.plan import identity_problem
from fleetctl.render import TEMPLATE_SUFFIX, render_host, template_of
from fleetctl.scan import changes_for, host_session
from fleetctl.templating import template_variables
from fleetctl.yamlfile import line_of, load_yaml

WRITTEN, REMOVED, REFUSED, NOTHING = "written", "removed", "refused", "nothing"
BACKPORT_MAX_BYTES = 256 << 20  # a hand-patched file up to 256 MiB is brought home
_GIT_MODES = {"0644", "0755"}


@dataclass(frozen=True, slots=True)
class BackportItem:
    """What backport did with one path.

    Attributes:
        path: relative to the managed tree (and, when written, to the blueprint).
        action: ``written`` (content, mode or link brought home), ``removed`` (deleted on the
            host, so deleted from the blueprint), ``refused`` or ``nothing`` (no hand-patch
            there).
        reason: for ``refused``/``nothing``, why, and what to do instead.
        diff: for a refused template, the diff from the rendered output to the live file.
    """

    path: str
    action: str
    reason: str | None = None
    diff: FileDiff | None = None

    def to_json(self) -> dict[str, Any]:
        """The item as a JSON object (``diff`` as in ``drift --diff``; a path that is not
        valid UTF-8 escaped, with ``path_escaped``)."""
        path, escaped = escape_name(self.path)
        return {"path": path, **({"path_escaped": True} if escaped else {}),
                "action": self.action, "reason": safe_text(self.reason) if self.reason else None,
                "diff": self.diff.to_json() if self.diff else None}


@dataclass(slots=True)
class BackportResult:
    """What ``backport`` did on one host.

    Attributes:
        host: the inventory name.
        items: one per path considered, in path order.
        git_diff: ``git diff`` of the blueprint after the writes, each line in the
            :func:`~fleetctl.diffs.show_diff_line` form (safe for a terminal, decodable back to
            the patch), split at ``\n`` only; empty when nothing was written or the blueprint
            is not in git.
    """

    host: str
    items: list[BackportItem] = field(default_factory=list)
    git_diff: list[str] = field(default_factory=list)

    @property
    def written(self) -> list[BackportItem]:
        """The items that changed the blueprint."""
        return [i for i in self.items if i.action in (WRITTEN, REMOVED)]


def backport(blueprint: Blueprint, host: Host, paths: list[str] | None = None,
             read: Callable[[Host, list[str], int], dict[str, bytes | str]] | None = None
             ) -> BackportResult:
    """Bring the hand-patches of ``host`` into the blueprint's work tree (never commits).

    Args:
        blueprint: the loaded blueprint (its directory is written).
        host: the host to read from.
        paths: only these paths (a directory covers what is below it); by default every path
            whose origin is ``hand-patch``. A ``conflict`` (changed both in the blueprint and
            on the host) is taken from the host only when named here.
        read: how live content is read (default: one round trip to the host).

    Raises:
        InputError: a named path is not a plain relative path.
        HostError: the host cannot be scanned or read, or records another identity.
    """
    if read is None:
        from fleetctl.hostops import read_live_files

        read = read_live_files
    wanted = [tree_path(p, "backport path") for p in paths or ()]
    tree = render_host(blueprint, host, with_credentials=False)
    with host_session(host, "scan") as (_session, state):
        changes = changes_for(blueprint, tree, state)
    problem = identity_problem(host, state)
    if problem:
        raise HostError(problem[0], hint=problem[1], step="scan")
    by_path: dict[str, list[Change]] = {}
    for change in changes:
        if not is_credential_path(change.path):  # rendered without secrets: judged below
            by_path.setdefault(change.path, []).append(change)
    patched_secrets = _hand_patched_credentials(state)

    def named(path: str) -> bool:
        return any(path == p or path.startswith(p + "/") for p in wanted)

    result = BackportResult(host.name)
    picked: dict[str, list[Change]] = {}
    for path, found in sorted(by_path.items()):
        origins = {c.origin for c in found}
        if wanted and not named(path):
            continue
        if HAND_PATCH in origins or (wanted and origins & {CONFLICT, UNKNOWN}):
            picked[path] = found
        elif wanted and origins == {PENDING}:
            result.items.append(BackportItem(path, NOTHING, "only the blueprint changed there "
                                             "(pending): nothing on the host to bring home"))
        elif CONFLICT in origins:
            result.items.append(BackportItem(path, REFUSED, "conflict: changed in the blueprint "
                                             "and on the host; name the path to take the "
                                             "host's version (git diff then shows what of the "
                                             "blueprint's change it replaces)"))
    for path in patched_secrets:
        if not wanted or named(path):
            was = state.shipped.get(path) if state.shipped is not None else None
            result.items.append(BackportItem(path, REFUSED,
                                             _credential_reason(host, path, was is not None)))
    for path in wanted:
        if not any(p == path or p.startswith(path + "/") for p in [*by_path, *patched_secrets]):
            result.items.append(BackportItem(path, NOTHING, "no change on the host there"))
    live_files = [p for p, cs in picked.items() if _live_file(cs) and not is_credential_path(p)]
    contents = read(host, live_files, BACKPORT_MAX_BYTES) if live_files else {}
    for path, found in picked.items():
        result.items.append(_one(blueprint, host, tree.contents, path, found, contents))
    result.items.sort(key=lambda i: i.path)
    if result.written:
        result.git_diff = _git_diff(blueprint.root, [i.path for i in result.written])
    return result


def _hand_patched_credentials(state: Any) -> list[str]:
    """Credential paths whose live entry differs from the shipped record: changed on the host.

    Backport renders no secret, so these are found against the record alone.
    """
    shipped = state.shipped
    if shipped is None:
        return []
    out = []
    for entry in state.live:
        if not is_credential_path(entry.path) or entry.type != FILE:
            continue
        was = shipped.get(entry.path)
        if was is None or (was.digest, was.mode, was.owner) != (entry.digest, entry.mode,
                                                                entry.owner):
            out.append(entry.path)
    return out


def _live_file(changes: list[Change]) -> bool:
    live = changes[0].live
    return live is not None and live.type == FILE


def _one(blueprint: Blueprint, host: Host, desired_contents: dict[str, bytes], path: str,
         changes: list[Change], contents: dict[str, bytes | str]) -> BackportItem:
    """Decide and carry out the backport of one path."""
    live, want = changes[0].live, changes[0].desired
    kinds = {c.change for c in changes}
    if is_credential_path(path):
        return BackportItem(path, REFUSED, _credential_reason(host, path))
    if (live is not None and live.type == DIR) or (want is not None and want.type == DIR):
        return BackportItem(path, REFUSED, "a directory: git records no directories; declare "
                            "its mode in attributes.yaml (dirs:) if that is what changed")
    if "owner" in kinds:
        owner = live.owner if live is not None else "-"
        return BackportItem(path, REFUSED, f"its owner changed on the host ({owner}): owners "
                            "come from attributes.yaml or the inventory")
    rendered = path.startswith("agents/") or (path + TEMPLATE_SUFFIX) in blueprint.files
    if rendered:
        source = (f"templates/{path.rsplit('/', 1)[-1]}.j2 (fleetctl's own)" if
                  path.startswith("agents/") else f"{path}{TEMPLATE_SUFFIX}")
        diff = None
        belongs = None
        if live is not None and live.type == FILE:
            body = contents.get(path)
            want_bytes = desired_contents.get(want.digest or "") if want is not None and \
                want.type == FILE else None
            if isinstance(body, bytes) and sha256_digest(body) == live.digest:
                diff = diff_contents(path, want_bytes, body, labels=("rendered", "live"))
                if want_bytes is not None:
                    belongs = where_it_belongs(blueprint, host, path, want_bytes, body)
        return BackportItem(path, REFUSED, f"rendered from the template {source}: "
                            f"{belongs or 'fold the change into the template by hand'} (the "
                            "diff shows rendered → live)", diff)
    if path not in blueprint.files and not _under_shipped_dir(blueprint, path):
        return BackportItem(path, REFUSED, "no blueprint file it could come from")
    if live is None or MISSING in kinds:
        return _apply(blueprint.root, path, lambda: _remove(blueprint.root, path), REMOVED)
    if live.type == SYMLINK:
        target = live.target or ""
        lands = posixpath.normpath(posixpath.join(posixpath.dirname(path), target))
        if target.startswith("/") or "\0" in target or lands == ".." or \
                lands.startswith("../"):
            return BackportItem(path, REFUSED, f"a symlink that leads out of the tree "
                                f"({show_name(target)}): refused")
        return _apply(blueprint.root, path, lambda: _write_link(blueprint.root, path, target),
                      WRITTEN)
    if live.type != FILE:
        return BackportItem(path, REFUSED, "a special file (fifo, socket or device) on the "
                            "host: only files and symlinks are brought home")
    rule = blueprint.file_rule(path)
    if "mode" in kinds or EXTRA in kinds:
        if rule and rule.mode and live.mode != rule.mode:
            return BackportItem(path, REFUSED, f"its mode {live.mode} differs from the mode "
                                f"{rule.mode} attributes.yaml declares for {rule.match!r}: "
                                "edit that rule by hand")
        if not (rule and rule.mode) and live.mode not in _GIT_MODES:
            return BackportItem(path, REFUSED, f"its mode {live.mode} cannot be recorded by "
                                "git (only 0644 and 0755): declare it in attributes.yaml")
    body = contents.get(path)
    if not isinstance(body, bytes):
        return BackportItem(path, REFUSED, f"its live content could not be read: "
                            f"{printable(str(body or 'not read'))}")
    if sha256_digest(body) != live.digest:
        return BackportItem(path, REFUSED, "changed on the host since the scan; run again")
    mode = 0o755 if live.mode == "0755" else 0o644
    return _apply(blueprint.root, path, lambda: _write_file(blueprint.root, path, body, mode),
                  WRITTEN)


def where_it_belongs(blueprint: Blueprint, host: Host, path: str, rendered: bytes,
                     live: bytes) -> str | None:
    """Where a hand-patch to the rendered file ``path`` belongs, for people: the role file and
    key, the inventory key, or the template's own text that the changed lines come from
    (:func:`fleetctl.linesources.line_sources`); when no line can be traced, the variables
    the template uses. ``None`` when the template cannot be read or rendered here."""
    try:
        found = template_of(blueprint, host, path)
        if found is None:
            return None
        source, name, context = found
        sources = line_sources(source, name, context)
    except (OSError, InputError):
        return None
    changed = changed_lines(rendered.split(b"\n"), live.split(b"\n"))
    keys = sorted({k for i in changed if i < len(sources) for k in sources[i]})
    own_text = any(i < len(sources) and not sources[i] for i in changed)
    places = list(dict.fromkeys(_place(blueprint, host, path, k) for k in keys))
    if not places and not own_text:
        used = sorted(template_variables(source))
        return (f"fold the change into {name} or the variables it uses "
                f"({', '.join(used) or 'none'})")
    # A line that shows a variable may also hold the template's own text around it: which of
    # the two the person changed cannot be told, so both are named.
    text = f"the template's own text ({name})" if own_text else \
        f"the text of {name} around them"
    return ("the changed line(s) come from " + "; ".join(places) + f" (or {text})"
            if places else f"the changed line(s) are {text}") + ": change it there and ship"


def _place(blueprint: Blueprint, host: Host, path: str, key: tuple[str, ...]) -> str:
    """Where the variable ``key`` of a rendered ``path`` of ``host`` is set, for people."""
    agent = next((a for a in host.agents if path == f"agents/{a.name}/agent.yaml"), None)
    if key[0] == "role" and len(key) == 2 and agent is not None:
        role_file = blueprint.root / "roles" / f"{agent.role}.yaml"
        shown = f"{blueprint.root.name}/roles/{agent.role}.yaml"
        try:
            data, node = load_yaml(role_file)
            line = line_of(node, [key[1]]) if isinstance(data, dict) and key[1] in data \
                else None
        except (OSError, InputError):
            line = None
        return f"{shown}:{line}: {key[1]}" if line else \
            f"{shown}: {key[1]} (not set there: the default applies)"
    if key == ("agent", "name") and agent is not None:
        return f"the inventory: the agent's name (hosts.{host.name}.agents.{agent.name})"
    if key[0] == "agent" and len(key) == 2 and agent is not None:
        return f"the inventory: hosts.{host.name}.agents.{agent.name}.{key[1]}"
    if key == ("host", "name"):
        return f"the inventory: the host's name (hosts.{host.name})"
    if key[0] == "host" and len(key) == 2:
        return f"the inventory: hosts.{host.name}.{key[1]}"
    if key == ("agents",):
        return f"the inventory: hosts.{host.name}.agents"
    return f"the inventory: vars.{key[0]} (of host {host.name} or its agent)"


def _under_shipped_dir(blueprint: Blueprint, path: str) -> bool:
    """Whether a path added on the host lies where blueprint files are shipped from."""
    parts = path.split("/")
    if parts[0] == "runner" and len(parts) > 1:
        return True
    return parts[0] == "skills" and len(parts) > 2 and parts[1] in blueprint.skills


def _credential_reason(host: Host, path: str, shipped: bool = True) -> str:
    parts = path.split("/")
    agent = next((a for a in host.agents if len(parts) > 1 and a.name == parts[1]), None)
    grants = ", ".join(g.capability for g in agent.grants) if agent else ""
    owner = (f"agent {agent.name}, whose grants are {grants or 'none'}" if agent else
             "no agent of this host")
    what = "a credential file" if shipped else "a file added under credentials/"
    return (f"{what} ({owner}): never backported; a secret is changed at its source, and "
            "`ship --force-path PATH` puts the granted files back")


def _apply(root: Path, path: str, action: Callable[[], None], done: str) -> BackportItem:
    try:
        action()
    except OSError as exc:
        why = "a symlink or a non-directory is on the way" if exc.errno in (
            errno.ELOOP, errno.ENOTDIR) else (exc.strerror or str(exc))
        return BackportItem(path, REFUSED, f"not written: {why} ({root.name}/{path})")
    return BackportItem(path, done)


def _open_parent(root: Path, rel: str, create: bool) -> tuple[int, str]:
    """Open the directory that holds ``rel`` inside ``root``, never through a symlink.

    Returns ``(fd, name)``; the caller closes the fd.

    Raises:
        OSError: a component is a symlink (ELOOP) or not a directory (ENOTDIR), or missing.
    """
    parts = rel.split("/")
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY)
    try:
        for part in parts[:-1]:
            try:
                nxt = os.open(part, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=fd)
            except FileNotFoundError:
                if not create:
                    raise
                os.mkdir(part, 0o755, dir_fd=fd)
                nxt = os.open(part, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=fd)
            os.close(fd)
            fd = nxt
    except BaseException:
        os.close(fd)
        raise
    return fd, parts[-1]


def _put(root: Path, rel: str, make: Callable[[int, str], None]) -> None:
    """Create ``rel`` inside ``root``: ``make(dir_fd, tmp_name)`` builds it under a temporary
    name in its (no-follow) parent, which is then renamed over the final name; a symlink there
    is replaced, never written through, and a directory there is refused."""
    fd, name = _open_parent(root, rel, create=True)
    tmp = f".{name[:200]}.fleetctl-backport"
    try:
        make(fd, tmp)
        _refuse_dir(fd, name)
        os.rename(tmp, name, src_dir_fd=fd, dst_dir_fd=fd)
    except BaseException:
        try:
            os.unlink(tmp, dir_fd=fd)
        except OSError:
            pass
        raise
    finally:
        os.close(fd)


def _write_file(root: Path, rel: str, data: bytes, mode: int) -> None:
    def make(fd: int, tmp: str) -> None:
        out = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600,
                      dir_fd=fd)
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(out, view):]
            os.fchmod(out, mode)
        finally:
            os.close(out)

    _put(root, rel, make)


def _write_link(root: Path, rel: str, target: str) -> None:
    _put(root, rel, lambda fd, tmp: os.symlink(target, tmp, dir_fd=fd))


def _refuse_dir(fd: int, name: str) -> None:
    try:
        st = os.stat(name, dir_fd=fd, follow_symlinks=False)
    except FileNotFoundError:
        return
    if stat.S_ISDIR(st.st_mode):
        raise OSError(errno.EISDIR, "a directory is in the blueprint at that path")


def _remove(root: Path, rel: str) -> None:
    fd, name = _open_parent(root, rel, create=False)
    try:
        _refuse_dir(fd, name)
        os.unlink(name, dir_fd=fd)
    finally:
        os.close(fd)


def _git_diff(root: Path, paths: list[str]) -> list[str]:
    """``git diff`` of the written paths (new files shown against nothing), escaped."""
    top = subprocess.run(["git", "-C", str(root), "rev-parse", "--show-toplevel"],
                         capture_output=True, check=False)
    if top.returncode != 0:
        return []
    specs = [str(root / p) for p in paths]
    env = {**os.environ, "GIT_PAGER": "cat", "LC_ALL": "C"}
    tracked = subprocess.run(["git", "-C", str(root), "diff", "--no-color", "--relative", "--",
                              *specs], capture_output=True, check=False, env=env).stdout
    untracked = subprocess.run(["git", "-C", str(root), "ls-files", "-z", "-o",
                                "--exclude-standard", "--", *specs],
                               capture_output=True, check=False, env=env).stdout
    lines = split_lines(tracked.decode("utf-8", "surrogateescape"))
    for name in filter(None, untracked.split(b"\0")):
        new = subprocess.run(["git", "diff", "--no-color", "--no-index", "--", "/dev/null",
                              os.fsdecode(name)], capture_output=True, check=False, env=env,
                             cwd=str(root)).stdout
        lines += split_lines(new.decode("utf-8", "surrogateescape"))
    return [show_diff_line(line.removesuffix("\n")) for line in lines]

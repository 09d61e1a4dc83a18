"""A ship under the host's lock: the steps from ``prepare`` to ``prune``.

After the scan the client sends a command: ``services`` (nothing to ship, bring the runners'
units in line), ``ship`` (a release to build), or anything else (stop). A ship emits ``step``
events ``prepare``, ``receive``, ``users`` (when the command lists users), ``assemble``,
``verify``, then ``prepared`` and waits for ``commit`` (any other command aborts: what was
staged is removed); then ``record``, ``credentials`` (when either tree has credentials),
``switch``, ``services`` (with ``units``), ``prune`` and ``done``.
"""

import errno
import os
import re

from fleetctl.host.accounts import account_missing, ensure_account, refuse_superuser
from fleetctl.host.credentials import apply_credentials
from fleetctl.host.files import fsync_dir, make_dir, temp_name, write_json
from fleetctl.host.remove import force_rmtree, mount_points, mounts_under, real_path
from fleetctl.host.services import services_problem, services_step
from fleetctl.host.stage import (
    assemble,
    cleanup,
    receive_blobs,
    receive_secrets,
    switch,
    verify,
    write_record,
)
from fleetctl.host.state import (
    PRUNING_ENTRY,
    PRUNING_PREFIX,
    STAGING_ENTRY,
    append_history,
    attempt_path,
    classify_releases,
    creds_record_path,
    failure_entry,
    good_releases,
    last_shipped,
    record_failure,
    record_path,
    recover_attempts,
    rollback_target,
    write_identity,
)
from fleetctl.host.walk import walk
from fleetctl.host.wire import (
    STATE_DIR_B,
    Aborted,
    Hangup,
    HangupGuard,
    Stop,
    dec,
    enc,
    os_error_text,
    owners_refused,
    read_json_frame,
)
from fleetctl.protocol import (
    DONE,
    PREPARED,
    STEP,
    WARNING,
    is_credential_path,
)


def prune(emit, root, keep, current):
    """Remove the good releases (:func:`~fleetctl.host.state.classify_releases`) but the
    newest ``keep``; return the removed ids.

    Only good releases are counted and removed: an entry fleetctl did not make (a file, a
    symlink, a directory copied in or without a record) is never counted, followed or removed,
    so it can neither push a good release out nor be deleted. Always kept, whatever ``keep``
    says: ``current`` (bytes), its rollback target (:func:`~fleetctl.host.state.rollback_target`)
    and the release the last ship put in use (after a rollback the newer release is the way
    forward again).

    A release with a mount point inside it (a directory someone mounted there) is kept whole,
    record included, and reported in a ``warning`` naming the mount point: it stays a complete
    release, pruned by the first ship after the unmount. Nothing is removed on another mount
    (see remove_tree), and a release that cannot be removed does not stop the others.
    """
    releases_dir = os.path.join(root, b"releases")
    good = good_releases(root, dec(current))
    points = mount_points()
    removed = []
    protected = {dec(current), rollback_target(root, dec(current), good)}
    shipped = last_shipped(root)
    if shipped is not None:
        protected.add(dec(shipped))
    kept = set(good[-keep:]) if keep > 0 else set()
    tried = set()
    for text in good:
        if text in protected or text in kept:
            continue
        name = enc(text)
        top = os.path.join(releases_dir, name)
        inside = mounts_under(points, real_path(top))
        if inside:
            emit({"t": WARNING, "message": "kept release {}: {} is a mount point inside it "
                  "(fleetctl removes nothing on another mount); unmount it and the next ship "
                  "prunes the release".format(dec(name), ", ".join(dec(p) for p in inside))})
            continue
        # Renamed first, then the record goes: a half-removed release must never look like a
        # rollback target, nor like a directory fleetctl did not make (those are never
        # removed), so what is left of it is a ``.pruning-<id>`` the next prune removes.
        tried.add(text)
        if _remove_release(emit, root, name, rename=True):
            removed.append(text)
    for entry in classify_releases(root):
        text = entry["id"][len(dec(PRUNING_PREFIX)):]
        if entry["kind"] == PRUNING_ENTRY and text not in tried:  # an earlier prune's leftover
            _remove_release(emit, root, enc(text), rename=False)
    return removed


def _remove_release(emit, root, name, rename):
    """Remove release ``name`` (bytes) by way of ``releases/.pruning-<name>`` (renamed there
    first when ``rename``), its records after the rename; True when all of it is gone. A
    failure is a ``warning`` naming the path: one stuck release must not stop the others."""
    gone = os.path.join(root, b"releases", PRUNING_PREFIX + name)
    try:
        if rename:
            os.rename(os.path.join(root, b"releases", name), gone)
        for record in (record_path(root, name), creds_record_path(root, name)):
            if os.path.lexists(record):
                os.unlink(record)
        return not force_rmtree(emit, gone)  # a mount that appeared since the check: reported
    except OSError as exc:
        path = exc.filename.decode("utf-8", "surrogateescape") if isinstance(
            exc.filename, bytes) else exc.filename
        emit({"t": WARNING, "message":
              f"could not prune release {dec(name)}: {os_error_text(exc)} ({path})"})
        return False


def changed_since_scan(root, scanned, ignore):
    """Re-hash ``current`` under the lock: a hand-patch made during the ship is never lost.

    Paths ``.fleetignore`` hides (runtime files such as ``__pycache__/``) may come and go.
    Returns ``[[path, what], ...]``, sorted by path: every tree path that differs from the scan
    (``what``: ``changed``, ``added``, ``removed`` or ``unreadable``); empty when none does.
    """
    again = []  # type: list
    problems = []
    walk(os.path.join(root, b"current/"), again.append, lambda rel, exc: problems.append(rel))

    def kept(entries):
        return {e["path"]: e for e in entries if not is_ignored(ignore, e)}

    now, before = kept(again), kept(scanned)
    changed = {dec(p) if isinstance(p, bytes) else p: "unreadable" for p in problems}
    for path in set(now) | set(before):
        if path not in before:
            changed.setdefault(path, "added")
        elif path not in now:
            changed.setdefault(path, "removed")
        elif now[path] != before[path]:
            changed.setdefault(path, "changed")
    return [[path, changed[path]] for path in sorted(changed)]


def edited(step, changed):
    """The refusal of a ship whose release in use was edited under it: names every path."""
    return Stop(step, "changed", f"the current release was edited during the ship "
                f"({len(changed)} path(s)); nothing was switched, run again to see the "
                "hand-patch", None, changed)


def layout_problem(root, state):
    """Why a ``current`` that is not a symlink stops a ship (the message)."""
    what = "directory" if state["current_kind"] == "dir" else "file or special file"
    return (f"{dec(root)}/current is a {what}, not a release symlink; move it aside to adopt "
            "this host")


def compile_ignore(patterns):
    """The ``.fleetignore`` patterns as the client sent them ((regex, include) pairs), compiled."""
    return [(re.compile(rx), include) for rx, include in patterns]


def is_ignored(ignore, entry):
    """Whether ``.fleetignore`` hides a manifest entry (the last matching pattern decides)."""
    # gitignore semantics as pathspec compiles them: the last matching pattern decides.
    path = entry["path"] + ("/" if entry["type"] == "dir" else "")
    verdict = False
    for rx, include in ignore:
        if rx.match(path):
            verdict = include
    return verdict


def do_ship(emit, inp, root, request, state, scanned, lock_fd, created_root):
    """Read the client's command and carry it out under the lock taken before the scan."""
    try:
        command = read_json_frame(inp)
        if command.get("cmd") == "services":
            # Nothing to ship, but the runners' units are brought in line (under the lock).
            emit({"t": STEP, "name": "services"})
            services_step(emit, command, restart_all=False)
            emit({"t": DONE, "release": None, "pruned": []})
            return 0
        if command.get("cmd") != "ship":
            emit({"t": DONE, "release": None, "pruned": []})
            return 0
        return ship_locked(emit, inp, root, command, state, scanned, created_root)
    finally:
        os.close(lock_fd)


def ship_locked(emit, inp, root, command, state, scanned, created_root=False):
    """Carry out a ``ship`` command under the lock: the steps from ``prepare`` to ``prune``.

    A ship that stops before its switch, for whatever reason (a step failed, the client
    called it off or went away: end of input, SIGHUP, SIGTERM), removes what it made and then
    appends a ``failed`` line to the history (the step, the error's kind, message and path,
    who, when, which commit; not into a root this ship created, which is removed again). A
    ship killed outright leaves its attempt file, which the next ship turns into such a line
    (:func:`~fleetctl.host.state.recover_attempts`). From the switch on, the ship finishes.

    Returns 0 (also when the client aborted after ``prepared``: what was staged is removed).
    Raises:
        Stop: a step failed or found the release edited during the ship (kind ``changed``);
            what the ship had made is removed first.
    """
    with HangupGuard() as guard:
        return _ship(emit, inp, root, command, state, scanned, created_root, guard)


def _ship(emit, inp, root, command, state, scanned, created_root, guard):
    """The body of :func:`ship_locked`, with its :class:`HangupGuard` armed."""
    ignore = compile_ignore(command.get("ignore", []))
    release = enc(command["release"])
    releases_dir = os.path.join(root, b"releases")
    stage = os.path.join(releases_dir, temp_name(b".staging-", release))
    blob_dir = os.path.join(root, STATE_DIR_B, temp_name(b"incoming-", release))
    current_dir = os.path.join(root, b"current")
    meta = command.get("meta", {})
    failure = failure_entry(release, state["current"], meta)
    attempt = attempt_path(root, release)
    made_release = False
    step = "prepare"

    def failed(step, kind, message, path=None, items=None):
        """On the way out of a ship that stopped before its switch (best effort throughout)."""
        cleanup(emit, stage, blob_dir, root, release, made_release)
        if not created_root:
            record_failure(emit, root, failure, step, kind, message, path, items)
        try:
            os.unlink(attempt)
        except OSError:
            pass

    try:
        emit({"t": STEP, "name": step})
        if command.get("units") is not None:
            # A unit directory or systemctl that cannot work fails here, before anything is
            # written, rather than in the services step after the switch.
            problem = services_problem(command)
            if problem:
                raise Stop(step, problem[0], problem[1])
        for path in (os.path.join(root, STATE_DIR_B), releases_dir):
            if os.path.islink(path) or (os.path.lexists(path) and not os.path.isdir(path)):
                # Assembling and recording would write through it, outside the root.
                raise Stop(step, "layout", f"{dec(path)} is not a directory of the root "
                           "(a symlink or a "
                           "file): fleetctl writes nothing through it; move it aside", dec(path))
            if not os.path.isdir(path):
                make_dir(path, 0o755)
        recover_attempts(emit, root, state["current"], write_history=not created_root)
        # Left by an interrupted ship; we hold the lock, so nothing else is using them.
        for entry in classify_releases(root):
            if entry["kind"] == STAGING_ENTRY:
                force_rmtree(emit, os.path.join(releases_dir, enc(entry["id"])))
        state_dir = os.path.join(root, STATE_DIR_B)
        for name in os.listdir(state_dir):
            if name.startswith(b"incoming-"):
                force_rmtree(emit, os.path.join(state_dir, name))
        if os.path.lexists(os.path.join(releases_dir, release)):
            raise Stop(step, "failed", f"release {dec(release)} already exists")
        # From here the ship may leave things behind: the attempt file says whose they are.
        write_json(attempt, failure, 0o644)
        tree = [e for e in command["desired"] if not is_credential_path(e["path"])]
        creds = [e for e in command["desired"] if is_credential_path(e["path"])]
        step = "receive"
        emit({"t": STEP, "name": step})
        release_dir = os.path.join(releases_dir, release)
        # A blob that does not fit is named by a tree path it is the content of.
        shown = {e["digest"]: os.path.join(release_dir, enc(e["path"])) for e in reversed(tree)
                 if e["type"] == "file" and e["path"] not in command["sources"]}
        receive_blobs(inp, blob_dir, command["blob_count"], shown)
        # Secrets stay in this process's memory: never in the blob directory, never on disk
        # anywhere but their final file.
        secrets = receive_secrets(inp, command.get("secret_count", 0))
        if command.get("users"):
            step = "users"
            emit({"t": STEP, "name": step})
            for account in command["users"]:
                refuse_superuser(account)
            missing = [a for a in command["users"] if account_missing(a)]
            changed = edited_during_ship(root, state, scanned, ignore) if missing else []
            if changed:
                # A refusal (exit 3) writes nothing: checked before accounts are created.
                raise edited(step, changed)
            refused = []  # type: list
            for account in command["users"]:
                ensure_account(emit, account, refused)
            if refused:
                raise owners_refused(step, refused, "nothing was switched")
        step = "assemble"
        emit({"t": STEP, "name": step})
        assemble(stage, tree, command["sources"], blob_dir, current_dir, release_dir)
        step = "verify"
        emit({"t": STEP, "name": step})
        try:
            verify(stage, tree)
        except Stop:
            # A file copied from the release in use after a person edited it differs from
            # the plan: that is a hand-patch made during the ship, refused like one.
            changed = edited_during_ship(root, state, scanned, ignore)
            if changed:
                raise edited(step, changed) from None
            raise
        # One flush of every filesystem instead of an fsync per file (2,000 fsyncs took most
        # of a ship's time): the release must be on disk before it can become current.
        os.sync()
        changed = edited_during_ship(root, state, scanned, ignore)
        if changed:
            raise edited(step, changed)
        # Two-phase across the fleet: this host is ready to switch; the client says commit
        # only once every host it ships is ready, so no host switches while another failed.
        # Until then the release stays a staging directory: a ship killed here leaves only a
        # leftover the next ship removes, never a release that looks shipped.
        step = "commit"  # before the event: a hangup right after it is at this step
        emit({"t": PREPARED, "release": dec(release)})
        try:
            go = read_json_frame(inp)
        except Stop as stop:
            raise Stop(step, "failed", "the client went away before it said commit ({})".format(
                stop.event["message"])) from None
        if go.get("cmd") != "commit":
            raise Aborted()
        step = "record"
        emit({"t": STEP, "name": step})
        os.rename(stage, os.path.join(releases_dir, release))
        made_release = True
        write_record(root, release, command["desired"], command.get("meta", {}))
        fsync_dir(releases_dir)
        changed = edited_during_ship(root, state, scanned, ignore)
        if changed:
            step = "switch"
            raise edited(step, changed)
        if creds or state.get("_creds"):
            step = "credentials"
            emit({"t": STEP, "name": step})
            apply_credentials(emit, root, creds, secrets, state.get("_creds") or [])
        step = "switch"
        emit({"t": STEP, "name": step})
        if command.get("identity") and command["identity"] != state.get("identity"):
            write_identity(root, command["identity"])
        # No signal stops the ship from here on: what comes after the rename finishes.
        guard.armed = False
        switch(root, release)
    except Aborted:
        failed("commit", "aborted", "called off by the client before the switch (another "
               "host of the run could not ship, or the run was interrupted)")
        emit({"t": DONE, "release": None, "pruned": [], "aborted": True})
        return 0
    except Stop as stop:
        failed(stop.event["step"], stop.event["kind"], stop.event["message"],
               stop.event["path"], stop.event.get("items"))
        raise
    except OSError as exc:
        kind = "permission" if exc.errno in (errno.EACCES, errno.EPERM) else "failed"
        path = exc.filename
        if isinstance(path, bytes):
            path = dec(path)
        message = f"{exc.__class__.__name__}: {os_error_text(exc)}"
        failed(step, kind, message, path)
        raise Stop(step, kind, message, path) from exc
    except Hangup as exc:
        message = (f"the connection to the client ended ({exc}) during step {step}; the "
                   "previous release stays in use")
        failed(step, "hangup", message)
        raise Stop(step, "failed", message) from None
    except BaseException as exc:  # a frame cut short, an interrupt: still recorded
        failed(step, "failed", f"{exc.__class__.__name__}: {exc}")
        raise
    append_history(emit, root, {"kind": "ship", "time": meta.get("created"),
                                "by": meta.get("shipped_by"), "release": dec(release),
                                "previous": state["current"], "host": meta.get("host"),
                                "forced": meta.get("forced"), "source": meta.get("source"),
                                "allow_dirty": meta.get("allow_dirty"),
                                "renamed_from": meta.get("renamed_from")})
    try:
        os.unlink(attempt)
    except OSError as exc:
        emit({"t": WARNING, "message": f"could not remove {dec(attempt)}: {os_error_text(exc)}"})
    # The new release is in use from here on: later trouble is a warning, never a rollback.
    try:
        force_rmtree(emit, blob_dir)
    except OSError as exc:
        emit({"t": WARNING, "message": f"could not remove {dec(blob_dir)}: {os_error_text(exc)}"})
    if command.get("units") is not None:
        # Before the prune: the runners move to the new release before older releases go, and
        # a failure here stops the ship with every release still on disk.
        emit({"t": STEP, "name": "services"})
        services_step(emit, command, restart_all=True)
    emit({"t": STEP, "name": "prune"})
    try:
        pruned = prune(emit, root, int(command.get("keep", 5)), release)
    except OSError as exc:  # the new release is in use; a failed prune is only reported
        pruned = []
        emit({"t": WARNING, "message": f"prune failed: {os_error_text(exc)}"})
    emit({"t": DONE, "release": dec(release), "pruned": pruned})
    guard.__exit__()
    return 0


def edited_during_ship(root, state, scanned, ignore):
    """What of the release in use changed since the scan (a hand-patch made during the ship):
    ``[[path, what], ...]`` (see changed_since_scan), empty when nothing did."""
    if state["current_kind"] not in ("symlink", "foreign-symlink"):
        return []
    return changed_since_scan(root, scanned, ignore)

"""Building a release beside the one in use: receiving content, assembling, verifying,
recording it, and switching ``current`` to it."""

import hashlib
import os

from fleetctl.host.files import (
    fsync_dir,
    json_tmp_path,
    make_dir,
    make_dirs,
    move_file,
    temp_name,
    write_all,
    write_file,
    write_json,
)
from fleetctl.host.remove import force_rmtree
from fleetctl.host.state import RECORD_SCHEMA, creds_record_path, record_path
from fleetctl.host.walk import tree_differences
from fleetctl.host.wire import (
    CHUNK_BYTES,
    STATE_DIR_B,
    Stop,
    dec,
    enc,
    owners_refused,
    parse_owner,
)
from fleetctl.protocol import is_credential_path


def receive_blobs(inp, blob_dir, count, shown=None):
    """Read ``count`` blob frames (``<digest>\\n<size>\\n<bytes>``) into ``blob_dir``.

    ``shown`` maps a digest to the path (bytes) a person knows its content by: the tree path in
    the release being made. An error writing a blob names that path, not the blob's internal
    name under ``incoming-<id>/``.

    Raises:
        Stop when the input ends early or a blob's digest does not match; OSError naming the
        file the blob is the content of when it cannot be written (a full disk).
    """
    make_dir(blob_dir, 0o700)
    for _ in range(count):
        digest = inp.readline().strip().decode("ascii")
        size = int(inp.readline())
        h = hashlib.sha256()
        name = os.path.join(blob_dir, digest.split(":", 1)[1].encode("ascii"))
        fd = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            os.fchmod(fd, 0o600)  # readable by this account for assembling, whatever the umask
            left = size
            while left:
                block = inp.read(min(left, CHUNK_BYTES))
                if not block:
                    raise Stop("receive", "failed", "input ended early (connection lost?)")
                h.update(block)
                try:
                    write_all(fd, block)
                except OSError as exc:  # a full disk: say which file did not fit
                    raise OSError(exc.errno, exc.strerror,
                                  (shown or {}).get(digest, name)) from exc
                left -= len(block)
        finally:
            os.close(fd)
        if "sha256:" + h.hexdigest() != digest:
            raise Stop("receive", "failed", "content arrived corrupted (digest mismatch)")


def assemble(stage, desired, sources, blob_dir, current_dir, shown_dir=None):
    """Build the release in ``stage`` from the desired manifest; modes and owners explicit.

    ``shown_dir`` is the directory the release will have once recorded (``releases/<id>``):
    errors name a path there, the one a person knows, never the staging name. Every entry
    whose owner cannot be set (no such user or group on the host, a chown refused) is
    collected while the rest is built, and all are named in one Stop.

    Raises:
        Stop: owners that could not be set (kind ``permission`` when the login may not give
            files away); an entry of a type that cannot be shipped.
        OSError: naming the entry's path under ``shown_dir`` (a full disk).
    """
    shown_dir = shown_dir or stage
    make_dir(stage, 0o700)
    # How many files of the release are still to take each received content: the last one
    # takes the received file itself (moved), the others a copy.
    uses = {}  # type: dict
    for entry in desired:
        if entry["type"] == "file" and sources.get(entry["path"]) is None:
            uses[entry["digest"]] = uses.get(entry["digest"], 0) + 1
    dirs = []
    refused = []  # (tree path, owner, OSError or message)
    for entry in desired:
        rel = enc(entry["path"])
        dest = os.path.join(stage, rel)

        def owner_refused(why, entry=entry):
            refused.append((entry["path"], entry["owner"], why))

        owner = (-1, -1)
        if entry.get("owner"):
            try:
                owner = parse_owner(entry["owner"], "assemble", entry["path"])
            except Stop as stop:
                owner_refused(stop.event["message"])
        kind = entry["type"]
        try:
            if kind == "dir":
                make_dir(dest, 0o700)  # writable by this account while filled, whatever the umask
                dirs.append((dest, owner, int(entry["mode"], 8), owner_refused))
            elif kind == "symlink":
                os.symlink(enc(entry["target"]), dest)
                if owner[0] != -1:
                    try:
                        os.lchown(dest, owner[0], owner[1])
                    except OSError as exc:
                        owner_refused(exc)
            elif kind == "file":
                source = sources.get(entry["path"])
                mode = int(entry["mode"], 8)
                if source is None:
                    source_path = os.path.join(blob_dir,
                                               entry["digest"].split(":", 1)[1].encode("ascii"))
                    uses[entry["digest"]] -= 1
                    if uses[entry["digest"]] == 0:  # in no release: moved, not copied
                        move_file(dest, source_path, owner, mode, owner_refused)
                    else:
                        write_file(dest, source_path, owner, mode, owner_refused)
                else:
                    # Copied from the current release, never hard-linked: releases must share
                    # no inode (docs/invariants.md, invariant 4).
                    source_path = os.path.join(current_dir, enc(source))
                    write_file(dest, source_path, owner, mode, owner_refused)
            else:
                raise Stop("assemble", "failed", f"cannot ship an entry of type {kind}",
                           entry["path"])
        except OSError as exc:
            raise OSError(exc.errno, exc.strerror, os.path.join(shown_dir, rel)) from exc
    # Directory modes last and deepest first, so a 0555 directory is filled before it closes.
    for dest, owner, mode, owner_refused in reversed(dirs):
        if owner[0] != -1:
            try:
                os.chown(dest, owner[0], owner[1])
            except OSError as exc:
                owner_refused(exc)
        os.chmod(dest, mode)
    if refused:
        raise owners_refused("assemble", sorted(refused, key=lambda r: r[0]),
                             "nothing was switched")
    os.chmod(stage, 0o755)


def verify(stage, desired):
    """Compare the staged release with the desired manifest; raise Stop on any difference."""
    problems, differences = tree_differences(
        stage, desired, ("type", "mode", "owner", "size", "digest", "target"), vanished_ok=False)
    for path, what, expected, got in differences:
        if what in ("extra", "missing"):
            problems.append("{}: {}".format(path, "unexpected" if what == "extra" else what))
        elif expected is not None:  # only what the plan sets is checked
            problems.append(f"{path}: {what} is {got}, expected {expected}")
    if problems:
        raise Stop("verify", "failed", "staged release differs from the plan: " +
                   "; ".join(problems[:5]) + (f" (and {len(problems) - 5} more)"
                                              if len(problems) > 5 else ""))


def write_record(root, release, desired, meta):
    """Write the release's record (0644) and, when it has credentials, their part (0600).

    The credential files' digests go to a side file only the shipping account can read: a
    digest of a guessable secret (a short password in a public template) must not be readable by
    every user of the host.
    """
    state_dir = os.path.join(root, STATE_DIR_B, b"releases")
    if not os.path.isdir(state_dir):
        make_dirs(state_dir, 0o755)
    tree = [e for e in desired if not is_credential_path(e["path"])]
    creds = [e for e in desired if is_credential_path(e["path"])]
    if creds:
        write_json(creds_record_path(root, release), {"schema_version": RECORD_SCHEMA,
                                                      "release": dec(release),
                                                      "manifest": creds}, 0o600)
    body = {"schema_version": RECORD_SCHEMA, "release": dec(release), "manifest": tree}
    body.update(meta)
    write_json(record_path(root, release), body, 0o644)


def switch(root, release):
    """Point ``current`` at the release with one atomic rename of a fresh symlink."""
    tmp = os.path.join(root, temp_name(b".current.", release))
    if os.path.lexists(tmp):
        os.unlink(tmp)
    os.symlink(b"releases/" + release, tmp)
    os.rename(tmp, os.path.join(root, b"current"))
    try:
        fsync_dir(root)
    except OSError:
        pass  # the switch has happened; durability of the rename is best effort past this


def receive_secrets(inp, count):
    """Read ``count`` secret frames (``<digest>\\n<size>\\n<bytes>``) into memory only."""
    secrets = {}
    for _ in range(count):
        digest = inp.readline().strip().decode("ascii")
        size = int(inp.readline())
        data = inp.read(size)
        if len(data) != size:
            raise Stop("receive", "failed", "input ended early (connection lost?)")
        if "sha256:" + hashlib.sha256(data).hexdigest() != digest:
            raise Stop("receive", "failed", "a credential arrived corrupted (digest mismatch)")
        secrets[digest] = data
    return secrets


def cleanup(emit, stage, blob_dir, root, release, made_release):
    """Remove what a failed ship made: the staging release, the received content and, when
    ``made_release`` (it got past the rename of its record step), the new release and its
    records (temporary ones too), the records first so a half-removed release is never taken
    for one. Best effort: an error here must not hide the one that stopped the ship; a mount
    point met is kept and reported (force_rmtree). A release of the same id that this ship did
    not make is never touched."""
    if made_release:
        for record in (record_path(root, release), json_tmp_path(record_path(root, release)),
                       creds_record_path(root, release),
                       json_tmp_path(creds_record_path(root, release))):
            try:
                os.unlink(record)
            except OSError:
                pass
    for path in (stage, blob_dir) + ((os.path.join(root, b"releases", release),)
                                     if made_release else ()):
        try:
            force_rmtree(emit, path)
        except OSError:
            pass

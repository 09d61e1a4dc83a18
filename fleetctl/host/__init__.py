"""The program fleetctl runs on a host, one process per operation, over any transport.

This package is sent as source over the transport's stdin on each run, together with
:mod:`fleetctl.protocol`, and imported from memory by the host's ``python3``
(:mod:`fleetctl.session`): nothing is installed on the host, so it imports only the standard
library and runs on Python 3.8+. Running the same code for the local and the SSH transport is
what keeps them equivalent, and the same functions run in a test process with a list as their
event sink.

Modules, by concept: :mod:`~fleetctl.host.wire` (input, event sink, errors),
:mod:`~fleetctl.host.walk` (the fd walk, scanning a tree), :mod:`~fleetctl.host.state` (the
layout, records, identity, history, the scan), :mod:`~fleetctl.host.lock`,
:mod:`~fleetctl.host.remove` (removal that follows no link), :mod:`~fleetctl.host.files`,
:mod:`~fleetctl.host.stage` (building a release), :mod:`~fleetctl.host.ship` (the steps under
the lock), :mod:`~fleetctl.host.credentials`, :mod:`~fleetctl.host.accounts`,
:mod:`~fleetctl.host.services`, :mod:`~fleetctl.host.ledgers`, :mod:`~fleetctl.host.status`,
:mod:`~fleetctl.host.readops`, :mod:`~fleetctl.host.releases`, and :mod:`~fleetctl.host.main`
(the entry point).
"""

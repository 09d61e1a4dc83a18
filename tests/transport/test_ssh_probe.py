"""A probe over SSH (``SshTransport.probe``) answers with the program's exit status even when
the program ends without reading the input it was given: a missing interpreter is the shell's
exit 127, and sudo's probes read it (``fleetctl/transport/sudoprobe.py``). Before, the send
into the closed channel raised and the probe said nothing, so sudo's verdict for "python3 is
not where the inventory says" came out as another one now and then (seen in a full run)."""

from __future__ import annotations

from fleetctl.inventory import load_inventory
from fleetctl.transport import open_transport
from tests.helpers import ssh_host, write_inventory

# More than an SSH channel's window (2 MiB), so the send must wait for the program to read.
BIG = b"x" * (4 << 20)


def test_a_program_that_reads_nothing_still_answers_with_its_status(
        tmp_path, sshd_pool, ssh_client_key, ssh_known_hosts):
    inv = write_inventory(tmp_path / "inv.yaml", {"web1": ssh_host(
        sshd_pool[0], ssh_client_key, ssh_known_hosts, tmp_path / "root")})
    (host,) = load_inventory(inv).hosts
    transport = open_transport(host)
    transport.connect()
    try:
        for argv, status in ((["/bin/sh", "-c", "exit 3"], 3),
                             ([str(tmp_path / "no-such-python3"), "-c", "pass"], 127)):
            found = transport.probe(argv, stdin=BIG)
            assert found.status == status, (argv, found)
        read = transport.probe(["/bin/sh", "-c", "wc -c"], stdin=BIG)
        assert (read.status, read.stdout.split()[-1]) == (0, str(len(BIG)).encode())
    finally:
        transport.close()

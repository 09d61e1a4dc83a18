"""``python -m fleetctl``."""

from fleetctl.cli import main

main()

"""fleetctl: keep a fleet of AI-agent hosts identical to one blueprint, and cheap to run."""

__version__ = "0.1.0"

"""Scripted stand-ins for agent harnesses (``claude``), for the harness-probe tests."""

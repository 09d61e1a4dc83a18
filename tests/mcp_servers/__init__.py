"""Real MCP servers for the tests, written with the official MCP Python SDK (``mcp``)."""

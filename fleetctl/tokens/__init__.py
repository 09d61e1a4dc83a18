"""``fleetctl tokens``: measure every agent's prompt prefix, hold it to budgets, and cut it.

The prompt prefix (DESIGN.md §2) is re-sent on every turn, so its size is paid again and again.
This package measures it with the runner's own prefix builder (docs/invariants.md, invariant 9), counts it
with a tokenizer whose provenance is printed in every report, and checks it against the budgets
the roles declare. One module per job:

- :mod:`fleetctl.tokens.offline`   the exact, offline ``o200k_base`` encoder and its provenance
- :mod:`fleetctl.tokens.counters`  the pluggable counters: offline o200k, the Claude estimate band,
  and Claude's ``count_tokens`` endpoint measured as deltas
- :mod:`fleetctl.tokens.declare`   the role settings this command reads (MCP servers, ceilings)
- :mod:`fleetctl.tokens.mcp_list`  listing an MCP server's tools: over stdio, or from a snapshot
- :mod:`fleetctl.tokens.models`    per-model facts: context window, tool-use system prompt
- :mod:`fleetctl.tokens.measure`   a prefix's components, its total and each tool's marginal cost
- :mod:`fleetctl.tokens.audit`     the library function behind the command: agents, budgets,
  ``--compare mcp``, ``--baseline``
- :mod:`fleetctl.tokens.render`    the report as text, JSON or Markdown, from the same records
- :mod:`fleetctl.tokens.live`      ``--live``: the runners' ledgers read from the hosts, per agent
- :mod:`fleetctl.tokens.deadweight` ``--live``: declared CLIs and MCP tools against those called

Importing this package imports nothing heavy: ``fleetctl.blueprint`` may import
:mod:`fleetctl.tokens.declare` for the role fields without pulling in a tokenizer or the MCP SDK.
"""

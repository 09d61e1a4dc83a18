"""A minimal MCP server over stdio, standard library only, that serves a saved ``tools/list``
result (``python tests/mcp_servers/snapshot_server.py SNAPSHOT.json``).

It starts in milliseconds (no SDK to import), for tests where the client gives a server little
time: Claude Code's ``claude -p`` sends its first request without a server that has not
answered within about two seconds. It answers ``initialize``, ``ping`` and ``tools/list`` (one
page); other requests get a JSON-RPC error; notifications are ignored.
"""

import json
import sys


def main() -> None:
    listing = json.loads(open(sys.argv[1], encoding="utf-8").read())
    for line in sys.stdin:
        if not line.strip():
            continue
        message = json.loads(line)
        if "id" not in message:
            continue
        method = message.get("method")
        if method == "initialize":
            result = {"protocolVersion": message["params"]["protocolVersion"],
                      "capabilities": {"tools": {}},
                      "serverInfo": {"name": "snapshot", "version": "1"}}
            if listing.get("instructions"):
                result["instructions"] = listing["instructions"]
            answer = {"jsonrpc": "2.0", "id": message["id"], "result": result}
        elif method == "ping":
            answer = {"jsonrpc": "2.0", "id": message["id"], "result": {}}
        elif method == "tools/list":
            answer = {"jsonrpc": "2.0", "id": message["id"],
                      "result": {"tools": listing["tools"]}}
        else:
            answer = {"jsonrpc": "2.0", "id": message["id"],
                      "error": {"code": -32601, "message": f"{method}: not supported"}}
        sys.stdout.write(json.dumps(answer) + "\n")
        sys.stdout.flush()


if __name__ == "__main__":
    main()

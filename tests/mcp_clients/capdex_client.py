"""An MCP client of capdex written with the official MCP Python SDK (`mcp` from PyPI).

Driven by `tests/it/mcp_clients.rs`. It connects over stdio (launching
`capdex mcp`) or streamable HTTP, runs one scenario, and prints one JSON
object of what it observed on its last line; the Rust test judges it.

Scenarios:
- `tour`: list tools, discover, call echo, bad arguments, an unknown tool,
  an approval accepted through elicitation, a cancelled call, an outcome,
  a route, a ping;
- `no-elicitation`: a gated call without the elicitation capability
  (requires_approval), or with `--approval-id` the approved retry;
- `direct`: direct mode: discover, wait for tools/list_changed, call the
  capability under its own name.
"""

import argparse
import asyncio
import json
import sys
import time

import anyio
import mcp_types as types
from mcp import Client, StdioServerParameters
from mcp.client.streamable_http import streamable_http_client


def structured(result):
    return {
        "isError": bool(result.is_error),
        "structured": result.structured_content,
        "text": "".join(getattr(block, "text", "") for block in result.content),
    }


class Person:
    """Answers approval elicitations: accept, decline, or never answer."""

    def __init__(self):
        self.mode = "accept"
        self.asked = []

    async def __call__(self, context, params):
        self.asked.append(params.message)
        if self.mode == "hang":
            await anyio.sleep(3600)
        if self.mode == "decline":
            return types.ElicitResult(action="decline")
        return types.ElicitResult(action="accept", content={"approve": True})


def connect(args, **options):
    if args.http:
        headers = {"Authorization": f"Bearer {args.token}"} if args.token else None
        http_client = None
        if headers:
            import httpx2

            http_client = httpx2.AsyncClient(headers=headers, timeout=httpx2.Timeout(30, read=300))
        url = args.http + ("?direct=true" if args.direct else "")
        return Client(streamable_http_client(url, http_client=http_client), **options)
    command = [args.capdex, "mcp"] + (["--direct"] if args.direct else [])
    env = {"CAPDEX_DATA_DIR": args.data_dir, "CAPDEX_LOG": "warn", "CAPDEX_METRICS_LISTEN_ADDR": "",
           "CAPDEX_CAPABILITY_DIRS": args.capability_dir, "CAPDEX_WATCH": "false"}
    if args.agent_id:
        env["CAPDEX_MCP_AGENT_ID"] = args.agent_id
    return Client(StdioServerParameters(command=command[0], args=command[1:], env=env), **options)


async def call(client, name, arguments, **kw):
    try:
        return structured(await client.call_tool(name, arguments, **kw))
    except Exception as err:  # a protocol error, not a tool error
        return {"exception": type(err).__name__, "message": str(err), "code": getattr(getattr(err, "error", None), "code", None)}


async def tour(args):
    person = Person()
    seen = {}
    async with connect(args, elicitation_callback=person, client_info=types.Implementation(name="py-tour", version="1")) as client:
        seen["protocolVersion"] = client.protocol_version
        tools = await client.list_tools()
        seen["tools"] = [tool.name for tool in tools.tools]
        seen["outputSchemas"] = [tool.name for tool in tools.tools if tool.output_schema]
        seen["discover"] = await call(client, "discover_capabilities", {"query": "echo some text back"})
        seen["echo"] = await call(client, "call_capability", {"id": "echo", "arguments": {"text": "hello mcp"}})
        seen["badArgs"] = await call(client, "call_capability", {"id": "echo", "arguments": {"text": 3}})
        seen["missingQuery"] = await call(client, "discover_capabilities", {"kind": "tool"})
        seen["unknownCapability"] = await call(client, "call_capability", {"id": "no_such_thing", "arguments": {}})
        seen["unknownTool"] = await call(client, "no_such_tool", {})
        seen["approved"] = await call(client, "call_capability", {"id": "guarded_echo", "arguments": {"text": "approved once"}})
        person.mode = "decline"
        seen["declined"] = await call(client, "call_capability", {"id": "guarded_echo", "arguments": {"text": "declined"}})
        person.mode = "hang"
        started = time.monotonic()
        seen["cancelled"] = await call(client, "call_capability", {"id": "guarded_echo", "arguments": {"text": "cancelled"}},
                                       read_timeout_seconds=1.0)
        seen["cancelSeconds"] = round(time.monotonic() - started, 2)
        person.mode = "accept"
        seen["afterCancel"] = await call(client, "call_capability", {"id": "echo", "arguments": {"text": "still here"}})
        seen["outcome"] = await call(client, "report_outcome", {"turnId": "py-turn-1", "status": "success",
                                                                "capabilities": ["tool:echo"], "organizationId": "py"})
        seen["route"] = await call(client, "route_sources", {"query": "list open issues"})
        await client.send_ping()
        seen["ping"] = True
        seen["elicitations"] = len(person.asked)
    return seen


async def no_elicitation(args):
    seen = {}
    async with connect(args, client_info=types.Implementation(name="py-plain", version="1")) as client:
        arguments = {"id": "guarded_echo", "arguments": {"text": "approved later"}}
        if args.approval_id:
            arguments["approvalId"] = args.approval_id
        seen["call"] = await call(client, "call_capability", arguments)
    return seen


async def direct(args):
    seen = {"changed": 0}
    changed = asyncio.Event()

    async def on_message(message):
        method = getattr(message, "method", None) or getattr(getattr(message, "root", None), "method", None)
        if method == "notifications/tools/list_changed":
            seen["changed"] += 1
            changed.set()

    async with connect(args, message_handler=on_message, client_info=types.Implementation(name="py-direct", version="1")) as client:
        seen["before"] = [tool.name for tool in (await client.list_tools()).tools]
        seen["discover"] = await call(client, "discover_capabilities", {"query": "echo some text back"})
        try:
            await asyncio.wait_for(changed.wait(), 10)
        except asyncio.TimeoutError:
            pass
        seen["after"] = [tool.name for tool in (await client.list_tools()).tools]
        seen["echo"] = await call(client, "echo", {"text": "direct call"})
    return seen


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("scenario", choices=["tour", "no-elicitation", "direct"])
    parser.add_argument("--capdex", help="the capdex binary (stdio)")
    parser.add_argument("--data-dir")
    parser.add_argument("--capability-dir", default="")
    parser.add_argument("--agent-id")
    parser.add_argument("--http", help="the streamable HTTP URL")
    parser.add_argument("--token")
    parser.add_argument("--direct", action="store_true")
    parser.add_argument("--approval-id")
    args = parser.parse_args()
    scenario = {"tour": tour, "no-elicitation": no_elicitation, "direct": direct}[args.scenario]
    seen = anyio.run(scenario, args)
    print(json.dumps(seen, default=str))
    sys.stdout.flush()


if __name__ == "__main__":
    main()

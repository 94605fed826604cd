#!/usr/bin/env python3
"""An agent runtime talking to capdex over NATS, written only against docs/api.md.

It registers its own capabilities (capdex.v1.capabilities.upsert), discovers
the ones that matter for a user message (capdex.v1.discover), calls one
(capdex.v1.dispatch), and reports task outcomes (capdex.v1.outcome). Each step
prints one JSON line: {"step": ..., ...}. Error replies (the Nats-Service-Error
headers) are printed as {"step": ..., "error": {code, message}} and make the
exit status 1.

    pip install -r examples/python/requirements.txt
    python examples/python/agent_runtime.py --url nats://127.0.0.1:4222 \
        --message "look up the invoice of a customer" --failures 8

Credentials: NATS_USER and NATS_PASSWORD, or NATS_TOKEN, in the environment.
"""

import argparse
import asyncio
import json
import os
import sys

import nats

# The capabilities this runtime offers (the shape of synthcat-1000.sources.json).
TOOLS = [
    {
        "id": "invoice-lookup",
        "name": "invoice-lookup",
        "displayName": "Invoice lookup",
        "description": "Look up a customer's invoices by customer id or invoice number and return amounts and due dates.",
        "category": "finance",
        "inputSchema": {
            "type": "object",
            "properties": {"customer_id": {"type": "string", "description": "The customer id."}},
            "required": ["customer_id"],
        },
    },
    {
        "id": "refund-request",
        "name": "refund-request",
        "displayName": "Refund request",
        "description": "Open a refund request for a paid invoice of a customer.",
        "category": "finance",
        "inputSchema": {
            "type": "object",
            "properties": {"invoice_id": {"type": "string", "description": "The invoice to refund."}},
            "required": ["invoice_id"],
        },
    },
]


class CapdexError(Exception):
    def __init__(self, step, error):
        super().__init__(f"{step}: {error}")
        self.step = step
        self.error = error


def emit(step, **fields):
    print(json.dumps({"step": step, **fields}, sort_keys=True), flush=True)


async def call(nc, prefix, step, endpoint, payload, timeout):
    """Sends one request; returns the decoded reply or raises CapdexError."""
    msg = await nc.request(f"{prefix}.{endpoint}", json.dumps(payload).encode(), timeout=timeout)
    body = json.loads(msg.data) if msg.data else {}
    headers = msg.headers or {}
    if "Nats-Service-Error-Code" in headers:
        raise CapdexError(step, {"status": int(headers["Nats-Service-Error-Code"]), **body})
    return body


async def run(args):
    options = {"servers": [args.url], "name": f"agent-runtime-{args.runtime_id}"}
    if os.environ.get("NATS_USER"):
        options.update(user=os.environ["NATS_USER"], password=os.environ.get("NATS_PASSWORD", ""))
    elif os.environ.get("NATS_TOKEN"):
        options.update(token=os.environ["NATS_TOKEN"])
    nc = await nats.connect(**options)
    try:
        registered = await call(
            nc, args.prefix, "register", "capabilities.upsert",
            {"runtimeId": args.runtime_id, "tools": TOOLS}, args.timeout,
        )
        emit("register", version=registered["version"], added=registered["added"],
             updated=registered["updated"], unchanged=registered["unchanged"])

        found = await call(nc, args.prefix, "discover", "discover", {"message": args.message}, args.timeout)
        emit("discover", tier1=[entry["id"] for entry in found["tier1"]],
             tier2=[entry["id"] for entry in found["tier2"]],
             totalTokens=found["tokenEstimate"]["totalTokens"])

        echoed = await call(
            nc, args.prefix, "dispatch", "dispatch",
            {"slug": "echo", "agentId": args.runtime_id, "arguments": {"text": args.message},
             "executionId": f"{args.runtime_id}-run", "stepId": "echo-1"}, args.timeout,
        )
        if not echoed.get("success"):
            emit("dispatch", error=echoed.get("error"))
            return 1
        emit("dispatch", slug="echo", success=True, output=echoed["data"])

        used = [entry["id"] for entry in found["tier1"][:2]]
        statuses = ["success"] * args.successes + ["failed"] * args.failures
        for number, status in enumerate(statuses):
            outcome = {
                "turnId": f"{args.runtime_id}-turn-{number}",
                "organizationId": args.organization,
                "personaId": args.persona,
                "status": status,
                "capabilities": used,
            }
            recorded = await call(nc, args.prefix, "outcome", "outcome", outcome, args.timeout)
            kpi = recorded["kpi"]
            emit("outcome", turnId=outcome["turnId"], status=status, accepted=recorded["accepted"],
                 duplicate=recorded["duplicate"], sampleCount=kpi["sampleCount"],
                 weightedSuccessRate=round(kpi["weightedSuccessRate"], 4))

        # A bad request on purpose: capdex must answer with an error reply, not stay silent.
        try:
            await call(nc, args.prefix, "bad-request", "discover", {"message": "hi", "bogus": 1}, args.timeout)
            emit("bad-request", error=None)
            return 1
        except CapdexError as err:
            emit("bad-request", error=err.error)
        return 0
    except CapdexError as err:
        emit(err.step, error=err.error)
        return 1
    finally:
        await nc.drain()


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", default=os.environ.get("NATS_URL", "nats://127.0.0.1:4222"))
    parser.add_argument("--prefix", default="capdex.v1", help="capdex's subject prefix")
    parser.add_argument("--runtime-id", default="python-agent")
    parser.add_argument("--message", default="look up the invoices of a customer")
    parser.add_argument("--organization", default="acme")
    parser.add_argument("--persona", default="support-bot")
    parser.add_argument("--successes", type=int, default=1, help="successful outcomes to report")
    parser.add_argument("--failures", type=int, default=0, help="failed outcomes to report after them")
    parser.add_argument("--timeout", type=float, default=10.0, help="seconds to wait for each reply")
    args = parser.parse_args()
    sys.exit(asyncio.run(run(args)))


if __name__ == "__main__":
    main()

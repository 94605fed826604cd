#!/usr/bin/env python3
"""Ops: prints capdex's alert events from NATS, one JSON line each.

Subscribes to <prefix>.alert.> (every severity and scope; see docs/api.md) and,
with --kpi, to <prefix>.kpi.> too. Prints {"subscribed": [...]} once the server
has the subscriptions, then {"subject": ..., "event": {...}} per event.
With --count N it exits 0 after N alerts; with --timeout S it exits 1 if they
have not all come within S seconds (for CI). Without them it runs until Ctrl-C.

    python examples/python/ops_alerts.py --url nats://127.0.0.1:4222 --count 1 --timeout 60

Credentials: NATS_USER and NATS_PASSWORD, or NATS_TOKEN, in the environment.
"""

import argparse
import asyncio
import json
import os
import sys

import nats


async def run(args):
    options = {"servers": [args.url], "name": "ops-alerts"}
    if os.environ.get("NATS_USER"):
        options.update(user=os.environ["NATS_USER"], password=os.environ.get("NATS_PASSWORD", ""))
    elif os.environ.get("NATS_TOKEN"):
        options.update(token=os.environ["NATS_TOKEN"])
    nc = await nats.connect(**options)
    done = asyncio.Event()
    alerts = 0

    async def on_event(msg):
        nonlocal alerts
        try:
            event = json.loads(msg.data)
        except ValueError:
            event = {"undecodable": msg.data.decode(errors="replace")}
        print(json.dumps({"subject": msg.subject, "event": event}, sort_keys=True), flush=True)
        if msg.subject.startswith(f"{args.prefix}.alert."):
            alerts += 1
            if args.count and alerts >= args.count:
                done.set()

    subjects = [f"{args.prefix}.alert.>"] + ([f"{args.prefix}.kpi.>"] if args.kpi else [])
    for subject in subjects:
        await nc.subscribe(subject, cb=on_event)
    # A round trip: the server has the subscriptions once this returns.
    await nc.flush()
    print(json.dumps({"subscribed": subjects}), flush=True)
    try:
        await asyncio.wait_for(done.wait(), timeout=args.timeout)
        status = 0
    except asyncio.TimeoutError:
        print(json.dumps({"timeout": args.timeout, "alerts": alerts, "wanted": args.count}), flush=True)
        status = 1
    await nc.drain()
    return status


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", default=os.environ.get("NATS_URL", "nats://127.0.0.1:4222"))
    parser.add_argument("--prefix", default="capdex.v1", help="capdex's subject prefix")
    parser.add_argument("--kpi", action="store_true", help="print KPI events too")
    parser.add_argument("--count", type=int, default=0, help="exit 0 after this many alerts (0: never)")
    parser.add_argument("--timeout", type=float, default=None, help="exit 1 after this many seconds")
    args = parser.parse_args()
    try:
        sys.exit(asyncio.run(run(args)))
    except KeyboardInterrupt:
        sys.exit(0)


if __name__ == "__main__":
    main()

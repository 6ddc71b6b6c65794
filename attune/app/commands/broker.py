"""`attune broker`: run the cluster broker, or start/stop the campaign's embedded local one.

    attune broker serve --campaign DIR [--campaign DIR ...] [--host H] [--port P] [--state-dir D]
    attune broker start DIR [--json]     the campaign's local broker on loopback (started on demand)
    attune broker token DIR [--json]     the campaign's token (created on first use)
    attune broker stop DIR [--json]      stop the campaign's local broker
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import time
from pathlib import Path

from attune.core.campaign_paths import CAMPAIGN_FILE, broker_dir
from attune.core.errors import EXIT_FAILED, EXIT_OK, UsageError
from attune.core.output import add_json_flag, emit_json


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("broker", help="the cluster broker: serve campaigns, or start/stop a campaign's local one")
    bsub = p.add_subparsers(dest="broker_command", metavar="SUBCOMMAND")
    bsub.required = True

    s = bsub.add_parser("serve", help="serve campaigns over HTTP (one bearer token per campaign)")
    s.add_argument("--campaign", action="append", required=True, metavar="DIR", help="campaign directory (repeatable)")
    s.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    s.add_argument("--port", type=int, default=0, help="port (default 0: any free port)")
    s.add_argument("--state-dir", default=None, help="where the broker-wide audit log goes")
    s.add_argument("--idle-exit-s", type=float, default=None,
                   help="exit after this many idle seconds with nothing in flight")
    s.add_argument("--log-level", default="warning", choices=["debug", "info", "warning", "error"])
    s.set_defaults(func=run_serve)

    st = bsub.add_parser("start", help="make sure the campaign's local broker runs; print its endpoint")
    st.add_argument("dir", help="campaign directory")
    add_json_flag(st)
    st.set_defaults(func=run_start)

    t = bsub.add_parser("token", help="print the campaign's broker token (created on first use)")
    t.add_argument("dir", help="campaign directory")
    add_json_flag(t)
    t.set_defaults(func=run_token)

    sp = bsub.add_parser("stop", help="stop the campaign's local broker")
    sp.add_argument("dir", help="campaign directory")
    add_json_flag(sp)
    sp.set_defaults(func=run_stop)


def _campaign_dir(path: str) -> Path:
    d = Path(path)
    if not (d / CAMPAIGN_FILE).is_file():
        raise UsageError(f"{d} is not a campaign directory (no campaign.yaml)")
    return d.resolve()


def run_serve(args: argparse.Namespace) -> int:
    import logging

    from broker.service import BrokerError, serve

    if not 0 <= args.port <= 65535:
        raise UsageError(f"--port must be between 0 and 65535, got {args.port}")
    if args.idle_exit_s is not None and args.idle_exit_s <= 0:
        raise UsageError(f"--idle-exit-s must be positive, got {args.idle_exit_s}")
    dirs = [_campaign_dir(d) for d in args.campaign]
    logging.basicConfig(level=args.log_level.upper(), stream=sys.stderr,
                        format="%(asctime)s %(name)s %(levelname)s %(message)s")
    try:
        serve(dirs, host=args.host, port=args.port, state_dir=Path(args.state_dir) if args.state_dir else None,
              idle_exit_s=args.idle_exit_s, log_level=args.log_level)
    except BrokerError as exc:
        raise UsageError(str(exc)) from None
    return EXIT_OK


def run_start(args: argparse.Namespace) -> int:
    from broker.client import BrokerUnavailable, ensure_local_broker
    from broker.service import token_path

    d = _campaign_dir(args.dir)
    try:
        ep = ensure_local_broker(d)
    except BrokerUnavailable as exc:
        print(f"attune broker start: {exc}", file=sys.stderr)
        return EXIT_FAILED
    payload = {"url": ep.url, "pid": ep.pid, "started": ep.started, "token_file": str(token_path(d))}
    if args.json:
        emit_json(payload)
    else:
        print(f"broker for {d.name} at {ep.url} (pid {ep.pid}, {'started now' if ep.started else 'already running'});"
              f" token in {token_path(d)}")
    return EXIT_OK


def run_token(args: argparse.Namespace) -> int:
    from broker.service import load_or_create_token, token_path

    d = _campaign_dir(args.dir)
    broker_dir(d).mkdir(mode=0o700, exist_ok=True)
    token = load_or_create_token(d)
    if args.json:
        emit_json({"token": token, "token_file": str(token_path(d))})
    else:
        print(token)
    return EXIT_OK


def run_stop(args: argparse.Namespace) -> int:
    from broker.client import running_broker

    d = _campaign_dir(args.dir)
    ep = running_broker(d)
    stopped = False
    if ep and ep.get("pid"):
        try:
            os.kill(int(ep["pid"]), signal.SIGTERM)
            stopped = True
        except ProcessLookupError:
            stopped = False
        deadline = time.monotonic() + 15
        while stopped and time.monotonic() < deadline and running_broker(d):
            time.sleep(0.1)
    if args.json:
        emit_json({"stopped": stopped, "endpoint": ep})
    else:
        print(f"stopped the broker at {ep['url']}" if stopped else "no broker was running for this campaign")
    return EXIT_OK



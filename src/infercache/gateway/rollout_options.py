"""`serve`'s rollout flags (gateway/rollout.py): a canary and shadow traffic declared at start,
as `POST /admin/rollout` declares one later."""

from __future__ import annotations

import argparse
from typing import Any


def add_rollout_options(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--canary",
        action="append",
        metavar="URL",
        help="an --upstream that carries a new model version (repeatable): a rollout declared "
        "at start, shared with every gateway on the store (default: none)",
    )
    p.add_argument(
        "--canary-share",
        type=float,
        default=0.0,
        metavar="F",
        help="the share of tenants (or conversations) the --canary upstreams serve, sticky "
        "(default 0: they serve only shadow traffic)",
    )
    p.add_argument(
        "--shadow-share",
        type=float,
        default=0.0,
        metavar="F",
        help="the share of the other requests mirrored to the --canary upstreams: their "
        "answers compared and recorded, never served or cached (default 0)",
    )
    p.add_argument(
        "--sticky",
        choices=("tenant", "conversation"),
        default="tenant",
        help="what the canary assignment sticks to (default tenant)",
    )
    p.add_argument(
        "--canary-version",
        metavar="V",
        help="the version the --canary upstreams serve, for upstreams that report none "
        "(default: what they report)",
    )


def rollout_flags(args: argparse.Namespace) -> dict[str, Any]:
    """The `rollout` setting the flags declare."""
    values: dict[str, Any] = {
        "canary": list(args.canary),
        "share": args.canary_share,
        "shadow": args.shadow_share,
        "sticky": args.sticky,
    }
    if args.canary_version is not None:
        values["version"] = args.canary_version
    return values

"""The `infercache` command line (argparse; every command has `--help`).

Each area registers its own sub-commands through a `register(subparsers)` function in its
package, so this file only assembles them. Heavy imports (torch, transformers) happen inside the
command handlers, never at startup.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence

Handler = Callable[[argparse.Namespace], int]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="infercache",
        description="A layered cache for LLM inference: exact, semantic and KV-prefix reuse.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    from infercache import cli_cache

    cli_cache.register(sub)
    from infercache.engine import cli as engine_cli

    engine_cli.register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(list(argv) if argv is not None else None)
    handler: Handler | None = getattr(args, "handler", None)
    if handler is None:
        parser.print_help(sys.stderr)
        return 2
    return handler(args)


if __name__ == "__main__":
    sys.exit(main())

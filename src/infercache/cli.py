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
    from infercache.analyze.cli import register as register_analyze
    from infercache.cli_cache import register as register_cache
    from infercache.engine.cli import register as register_engine
    from infercache.gateway.cli import register as register_gateway
    from infercache.semantic.cli import register as register_semantic

    register_gateway(sub)
    register_cache(sub)
    register_engine(sub)
    register_semantic(sub)
    register_analyze(sub)
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

"""The `infercache` command line (argparse; every command has `--help`).

Each area registers its own sub-commands through a `register(subparsers)` function in its
package, so this file only assembles them. Heavy imports (torch, transformers) happen inside the
command handlers, never at startup.

An optional part that is not installed (extras.py) is a one-line error naming the extra to
install, exit code 2, no traceback: a handler's `require` raises `MissingExtraError`, and as a
last resort an import of a module an extra provides that no `require` guarded is translated here.

A bad flag is reported with the usage of the command it was given to (`serve --bogus` shows
serve's usage): argparse hands a sub-command's unrecognised arguments back to the top-level
parser, which would report them with its own usage, so every sub-command parser is a
`_CommandParser` that reports them itself.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable, Sequence
from typing import Any

from infercache import __version__
from infercache.errors import MissingExtraError
from infercache.extras import missing_module_error
from infercache.progress_bars import quiet_off_terminal

Handler = Callable[[argparse.Namespace], int]


class _CommandParser(argparse.ArgumentParser):
    """A sub-command's parser: arguments it does not know are an error with its own usage."""

    def parse_known_args(  # type: ignore[override]
        self, args: Sequence[str] | None = None, namespace: argparse.Namespace | None = None
    ) -> tuple[argparse.Namespace, list[str]]:
        parsed, extras = super().parse_known_args(args, namespace)
        if extras:
            self.error(f"unrecognized arguments: {' '.join(extras)}")
        return parsed, extras

    def add_subparsers(self, **kwargs: Any) -> Any:
        kwargs.setdefault("parser_class", _CommandParser)
        return super().add_subparsers(**kwargs)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="infercache",
        description="A layered cache for LLM inference: exact, semantic and KV-prefix reuse.",
    )
    parser.add_argument("--version", action="version", version=f"infercache {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_CommandParser)
    from infercache.analyze.cli import register as register_analyze
    from infercache.cli_cache import register as register_cache
    from infercache.engine.cli import register as register_engine
    from infercache.gateway.cli import register as register_gateway
    from infercache.semantic.tuning.cli import register as register_semantic

    register_gateway(sub)
    register_cache(sub)
    register_engine(sub)
    register_semantic(sub)
    register_analyze(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    quiet_off_terminal(sys.stderr, os.environ)  # no \r-joined bars in a log (progress_bars.py)
    parser = build_parser()
    args = parser.parse_args(list(argv) if argv is not None else None)
    handler: Handler | None = getattr(args, "handler", None)
    if handler is None:
        parser.print_help(sys.stderr)
        return 2
    try:
        return handler(args)
    except ImportError as exc:
        missing = _missing_extra(exc)
        if missing is None:
            raise
        print(f"infercache {args.command}: {missing}", file=sys.stderr)
        return 2


def _missing_extra(exc: ImportError) -> MissingExtraError | None:
    """The error naming the extra to install, for a part that is not installed; else None."""
    if isinstance(exc, MissingExtraError):
        return exc
    if isinstance(exc, ModuleNotFoundError):
        return missing_module_error(exc.name)
    return None  # a broken install, not a missing one: keep its traceback


if __name__ == "__main__":
    sys.exit(main())

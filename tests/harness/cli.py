"""Commands run in-process, as the command line runs them, with an empty environment."""

from __future__ import annotations

import argparse

from infercache.analyze.cli import register


def run_analyze(*argv: str) -> int:
    """`infercache analyze ARGV...`; its exit code (no environment variables are read)."""
    parser = argparse.ArgumentParser(prog="infercache")
    register(parser.add_subparsers())
    args = parser.parse_args(["analyze", *argv])
    code: int = args.handler(args, environ={})
    return code

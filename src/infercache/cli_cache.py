"""Store administration commands: `stats`, `invalidate`, `set-model-version`, `purge`.

Each works on the store a URL names (`--store`, default: the settings' store), so it acts on
the same SQLite file or Redis server a running gateway uses, from another process.

`stats`, `invalidate` and `purge` only read or change a store that exists: a SQLite file that
is not there is an error, and nothing is created (a typo in a path never leaves a new database
or directory behind). `set-model-version` may create the store: it records state a gateway
started later will read. `memory://` is refused: it lives inside one process, out of reach.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from infercache.clock import SystemClock
from infercache.errors import ConfigError, InfercacheError
from infercache.settings import Settings
from infercache.stores import Backend, open_store
from infercache.stores.memory import MemoryStore
from infercache.stores.sqlite import SQLiteStore
from infercache.versions import Versions


def add_store_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--store",
        metavar="URL",
        help="sqlite:///PATH, redis://HOST:PORT/DB (one server), "
        "redis+cluster://HOST:PORT[,HOST:PORT...] (a Redis Cluster; rediss:// and "
        "rediss+cluster:// for TLS) or memory:// (default: INFERCACHE_STORE, else [cache] store "
        "in --config, else sqlite:///<data dir>/cache.sqlite3, the data dir being "
        "~/.cache/infercache or "
        "INFERCACHE_DATA_DIR)",
    )
    parser.add_argument(
        "--config",
        metavar="FILE",
        type=Path,
        help="TOML settings file: [cache], [prices], [semantic], [gateway] (default: none)",
    )


def settings_from_args(args: argparse.Namespace) -> Settings:
    settings = Settings.load(config_file=args.config)
    if getattr(args, "store", None):
        settings = settings.with_env({"INFERCACHE_STORE": args.store})
    return settings


def _open(args: argparse.Namespace, *, create: bool = False) -> Backend:
    """The store `args` name; unless `create`, only one that exists (opening is lazy, so a
    refused store was never touched)."""
    settings = settings_from_args(args)
    url = settings.resolved_store_url
    backend = open_store(url, clock=SystemClock(), max_bytes=settings.max_store_bytes)
    if isinstance(backend, MemoryStore):
        raise ConfigError(
            f"{url} is a store inside one process: this command cannot reach it; name the "
            "gateway's SQLite or Redis store with --store"
        )
    if not create and isinstance(backend, SQLiteStore) and not backend.path.is_file():
        raise ConfigError(f"no store at {url}: {backend.path} does not exist (nothing created)")
    return backend


def _stats(args: argparse.Namespace) -> int:
    backend = _open(args)
    try:
        s = backend.stats()
        out: dict[str, Any] = {
            "store": backend.url,
            "entries": s.entries,
            "bytes": s.bytes,
            "max_bytes": s.max_bytes,
        }
        if args.model:
            versions = Versions(backend)
            out["model_versions"] = {m: versions.model_version(m) for m in args.model}
    finally:
        backend.close()
    print(json.dumps(out, indent=2))
    return 0


def _invalidate(args: argparse.Namespace) -> int:
    backend = _open(args)
    try:
        n = Versions(backend).invalidate(args.tag)
    finally:
        backend.close()
    print(f"invalidated {n} tag(s): {', '.join(sorted(set(args.tag)))}")
    return 0


def _set_model_version(args: argparse.Namespace) -> int:
    backend = _open(args, create=True)
    try:
        changed = Versions(backend).set_model_version(args.model, args.version)
    finally:
        backend.close()
    if changed:
        print(f"{args.model}: version is now {args.version}; older entries are unreachable")
    else:
        print(f"{args.model}: version already {args.version}; nothing changed")
    return 0


def _purge(args: argparse.Namespace) -> int:
    backend = _open(args)
    try:
        n = backend.purge()
    finally:
        backend.close()
    print(f"purged {n} entries from {backend.url}")
    return 0


def _guarded(handler: Any) -> Any:
    def run(args: argparse.Namespace) -> int:
        try:
            code: int = handler(args)
        except InfercacheError as exc:
            print(f"infercache: {exc}", file=sys.stderr)
            return 1
        return code

    return run


def register(sub: argparse._SubParsersAction[Any]) -> None:
    p = sub.add_parser("stats", help="entries and bytes in the store")
    add_store_options(p)
    p.add_argument(
        "--model",
        action="append",
        default=[],
        help="also show this model's current version (repeatable; default: none)",
    )
    p.set_defaults(handler=_guarded(_stats))

    p = sub.add_parser("invalidate", help="make every entry depending on a tag unreachable")
    add_store_options(p)
    p.add_argument(
        "--tag", action="append", required=True, help="a tag to invalidate (repeatable; required)"
    )
    p.set_defaults(handler=_guarded(_invalidate))

    p = sub.add_parser(
        "set-model-version", help="make a model version current; older entries unreachable"
    )
    add_store_options(p)
    p.add_argument("model", help="the model id requests name (e.g. gpt-4o-mini)")
    p.add_argument("version", help="its new version: any string different from the current one")
    p.set_defaults(handler=_guarded(_set_model_version))

    p = sub.add_parser("purge", help="delete every entry (versions and tags are kept)")
    add_store_options(p)
    p.set_defaults(handler=_guarded(_purge))

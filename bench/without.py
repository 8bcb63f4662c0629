"""Run `infercache` with some per-request features switched off, to measure what they cost.

    .venv/bin/python bench/without.py FEATURES infercache-arguments...
    .venv/bin/python bench/gateway.py --without metrics,feedback,guard,head-bound

FEATURES is a comma list of:

- `metrics`: the gateway's per-request `/metrics` series (`RequestMetrics.record`);
- `feedback`: the answers remembered for `report_wrong` (`ServedAnswers.remember`);
- `guard`: the store's latency budget and circuit breaker around each call
  (`GuardedBackend._call` calls the store directly);
- `head-bound`: the 64 KB bound on request heads (uvicorn's own httptools protocol instead of
  `BoundedHeadersProtocol`);
- `nonblocking`: the store calls the gateway makes on the event loop run as plain calls, as
  before the hardening (no non-blocking mode for reads, no write transaction taken without
  waiting; a locked or stalled store then stalls the loop).

A measuring device only, for `bench/gateway.py`: each feature is replaced by a no-op (or a
direct call) before the CLI starts, so the gateway serves as usual without it. Nothing in the
package reads this.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Callable
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any


def _replace(owner: object, name: str, value: object) -> None:
    """Set `owner.name`, which must exist: a renamed target fails here rather than leaving
    the feature on and the measurement silently wrong."""
    if not hasattr(owner, name):
        raise AttributeError(f"{owner!r} has no {name!r}: bench/without.py is out of date")
    setattr(owner, name, value)


def _no_metrics() -> None:
    from infercache.gateway.traffic import RequestMetrics

    _replace(RequestMetrics, "record", lambda self, *args, **kwargs: None)


def _no_feedback() -> None:
    from infercache.served_answers import ServedAnswers

    _replace(ServedAnswers, "remember", lambda self, *args, **kwargs: None)


def _no_guard() -> None:
    from infercache.store_guard import GuardedBackend

    def call(self: GuardedBackend, fn: Callable[..., Any], *args: Any) -> Any:
        return fn(*args)

    _replace(GuardedBackend, "_call", call)


def _no_head_bound() -> None:
    from infercache.gateway import http_server

    bounded = http_server.server_config

    def server_config(app: Any, **options: Any) -> dict[str, Any]:
        config = bounded(app, **options)
        del config["http"]  # uvicorn's default: its own httptools protocol
        return config

    _replace(http_server, "server_config", server_config)


def _no_nonblocking() -> None:
    from infercache import store_guard

    def plain(backend: object) -> Callable[[], AbstractContextManager[None]]:
        return contextlib.nullcontext

    _replace(store_guard, "inline_reads", plain)
    _replace(store_guard, "inline_writes", plain)


FEATURES: dict[str, Callable[[], None]] = {
    "metrics": _no_metrics,
    "feedback": _no_feedback,
    "guard": _no_guard,
    "head-bound": _no_head_bound,
    "nonblocking": _no_nonblocking,
}


def command(features: str) -> list[str]:
    """The command that runs `infercache` with `features` (a comma list) off; with none, the
    installed `infercache` script itself."""
    if not features:
        return [str(Path(sys.executable).parent / "infercache")]
    return [sys.executable, str(Path(__file__).resolve()), features]


def main() -> int:
    names = [name for name in sys.argv[1].split(",") if name]
    unknown = sorted(set(names) - set(FEATURES))
    if unknown:
        raise SystemExit(f"unknown features {unknown}; known: {sorted(FEATURES)}")
    for name in names:
        FEATURES[name]()
    from infercache.cli import main as cli_main

    return cli_main(sys.argv[2:])


if __name__ == "__main__":
    sys.exit(main())

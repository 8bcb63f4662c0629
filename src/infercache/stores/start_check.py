"""Is the store there? Asked once when a server starts, before anything slow loads.

A store URL with a typo (a wrong port, host or path) otherwise starts a gateway that serves
and caches nothing: every lookup is a `store_unavailable` miss, with only WARNING lines to say
so. So `serve` asks the store once at start (`check_at_start`), before the engine loads:

    each check in `checks` runs on the store as opened, in a thread of its own given
    `timeout_s` (its own client timeout bounds a call too):
      `reachable`  reads one meta value (`EPOCH_META`): the server answers, the file opens;
                   a `StoreError` is retried `attempts` times (a store that is only starting
                   may refuse the first connection), then is the reason
      (a check added here for one kind of store, e.g. a Redis URL naming a cluster node,
       raises `ConfigError` itself: a refusal, never retried, never optional)
    every check passed      → `StoreAtStart(reachable=True)`
    a store error remained  → required (the default): `StoreUnreachableError` (a ConfigError:
                              `serve` prints it as one line and exits 2), naming the URL with
                              its credentials masked and the store's own reason
                              optional (`--store-optional`): `StoreAtStart(reachable=False,
                              reason)`: the server starts degraded on purpose and says so (its
                              ready line, `/healthz`); the store guard keeps probing it

A check is any `Callable[[Backend], None]`; `DEFAULT_CHECKS` is what `serve` runs.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from infercache.errors import ConfigError, StoreError
from infercache.stores.base import EPOCH_META, Backend, ThreadResources
from infercache.urls import mask_credentials

log = logging.getLogger(__name__)

StartCheck = Callable[[Backend], None]


class StoreUnreachableError(ConfigError):
    """The store named at start does not answer (and it was not declared optional)."""


@dataclass(frozen=True, slots=True)
class StoreAtStart:
    url: str  # credentials masked
    reachable: bool
    reason: str | None = None  # why it is not (the store's own words), when it is not

    def describe(self) -> str:
        """The store as a ready line names it."""
        if self.reachable:
            return self.url
        return f"{self.url}, unreachable: degraded, caching nothing until it answers"


def reachable(backend: Backend) -> None:
    """One read of one meta value: raises `StoreError` when the store cannot answer it."""
    backend.read_meta([EPOCH_META])


DEFAULT_CHECKS: tuple[StartCheck, ...] = (reachable,)


def check_at_start(
    backend: Backend,
    *,
    optional: bool = False,
    checks: Sequence[StartCheck] = DEFAULT_CHECKS,
    attempts: int = 3,
    timeout_s: float = 1.0,
) -> StoreAtStart:
    """Run `checks` on `backend` (see the module docstring); `optional` starts degraded
    instead of refusing a store that does not answer."""
    url = mask_credentials(backend.url)
    failure: StoreError | None = None
    for _ in range(max(1, attempts)):
        try:
            _in_own_thread(backend, checks, timeout_s)
        except StoreError as exc:
            failure = exc
            continue
        return StoreAtStart(url, reachable=True)
    reason = _one_line(str(failure))
    if not optional:
        raise StoreUnreachableError(
            f"cannot reach the cache store {url}: {reason}. Check --store (or INFERCACHE_STORE), "
            "or pass --store-optional to serve without caching until it answers"
        )
    log.warning(
        "cache store %s unreachable at start (%s): serving degraded, caching nothing until it "
        "answers (--store-optional)",
        url,
        reason,
    )
    return StoreAtStart(url, reachable=False, reason=reason)


def _in_own_thread(backend: Backend, checks: Sequence[StartCheck], timeout_s: float) -> None:
    """Run the checks in a thread of their own, given `timeout_s`: a store that neither
    answers nor fails (a host that drops packets) is a `StoreError` then. The thread ends with
    the checks, and closes what it opened for itself first (`ThreadResources`: SQLite's
    per-thread connection), so the store is left as the checks found it: another process may
    still lock the file alone."""
    outcome: list[BaseException | None] = []

    def run() -> None:
        failure: BaseException | None = None
        try:
            for check in checks:
                check(backend)
        except BaseException as exc:  # noqa: BLE001 - handed to the caller below
            failure = exc
        finally:
            if isinstance(backend, ThreadResources):  # closed before the caller goes on
                backend.release_thread()
        outcome.append(failure)

    thread = threading.Thread(target=run, name="infercache-store-check", daemon=True)
    thread.start()
    thread.join(timeout_s)
    if not outcome:
        raise StoreError(f"no answer within {timeout_s:g} s")
    if outcome[0] is not None:
        raise outcome[0]


def _one_line(text: str) -> str:
    """A store's message on one line, with credentials in any URL it quotes masked."""
    words = " ".join(text.split())
    return " ".join(mask_credentials(w) if "://" in w else w for w in words.split(" ")).rstrip(".")

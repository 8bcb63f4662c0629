"""How a server stops: the first Ctrl-C (or SIGTERM) drains, a second Ctrl-C cuts.

uvicorn stops accepting on the first signal and waits for the requests in flight. A second
Ctrl-C sets its `force_exit`: it then returns without running the application's shutdown and
leaves `asyncio.run` to cancel whatever still runs, so each cut request and the lifespan log a
`CancelledError` traceback as if the application had failed, and the application's own shutdown
(closing the cache's store, the request log, the engine) runs only as a side effect of that
cancellation.

`DrainingServer` does the cut itself, in order:
1. on the first signal it says how many requests it waits for and that Ctrl-C again cuts them
   (uvicorn says so only at INFO, which `serve` does not show);
2. after a second Ctrl-C it cancels the requests still running and waits for them, with the
   `CancelledError`s uvicorn logs for them ("Exception in ASGI application") filtered out for
   that wait only: they are the cut, not a failure;
3. then it runs the application's shutdown as a graceful stop would, and says in one line how
   many requests were cut. A cut answer is never cached: it never finished.

Stopped as asked, it does not raise the signals again on the way out (uvicorn does, for a
program that embeds it; here the second SIGINT became a `KeyboardInterrupt` traceback), and
`exit_on_signals()` makes a signal that arrives before the server runs (while a model loads) an
ordinary exit too: `serve` and `engine serve` end with status 0 and no traceback either way.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import socket
from collections.abc import Iterator

import uvicorn

log = logging.getLogger("uvicorn.error")


class DrainingServer(uvicorn.Server):
    """uvicorn's server whose second Ctrl-C cuts the requests in flight and still shuts the
    application down, without a traceback."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        with super().capture_signals():
            yield
            self._captured_signals.clear()  # handled here: nothing to raise again

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        in_flight = len(self.server_state.tasks)
        if in_flight and not self.force_exit:
            log.warning(
                "stopping: waiting for %d request(s) in flight to finish; Ctrl-C again cuts them",
                in_flight,
            )
        await super().shutdown(sockets=sockets)
        if self.force_exit:
            cut = await _cut(self.server_state.tasks)
            await self.lifespan.shutdown()  # what uvicorn skips on a forced exit
            log.warning("stopped: %d request(s) cut short by a second Ctrl-C", cut)


def exit_on_signals() -> None:
    """SIGINT and SIGTERM end the process as an ordinary exit (`SystemExit(0)`, so `with`
    blocks close what they hold) until the server takes them over, and after it."""
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, _exit)


def _exit(_signum: int, _frame: object) -> None:
    raise SystemExit(0)


async def _cut(tasks: set[asyncio.Task[None]]) -> int:
    """Cancel the running `tasks` and wait for them; their cancellation is not logged."""
    running = [task for task in tasks if not task.done()]
    quiet = _CutRequests()
    log.addFilter(quiet)
    try:
        for task in running:
            task.cancel()
        await asyncio.gather(*running, return_exceptions=True)
    finally:
        log.removeFilter(quiet)
    return len(running)


class _CutRequests(logging.Filter):
    """Drops the records of requests ending in the `CancelledError` of the cut."""

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        return not isinstance(exc, asyncio.CancelledError)

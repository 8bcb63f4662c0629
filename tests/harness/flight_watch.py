"""Waiting on a flight table's observable state instead of sleeping: `FlightWatch` is the
table's observer (flight.py `FlightObserver`) and wakes its waiters on every change."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from infercache.flight import Flight, FlightTable


class FlightWatch:
    def __init__(self, table: FlightTable[Any]) -> None:
        self.table = table
        self._changed = threading.Condition()
        table.observer = self

    def changed(self) -> None:
        with self._changed:
            self._changed.notify_all()

    def until(self, predicate: Callable[[], bool], timeout_s: float = 30) -> bool:
        with self._changed:
            return self._changed.wait_for(predicate, timeout_s)

    def waiters(self, key: str, n: int, timeout_s: float = 30) -> bool:
        """Until `n` callers wait on the flight for `key`."""

        def enough() -> bool:
            flight = self.table.in_progress().get(key)
            return flight is not None and flight.waiters >= n

        return self.until(enough, timeout_s)

    def flights(self, flights: int, waiting: int = 0, timeout_s: float = 30) -> bool:
        """Until at least `flights` flights are in progress with `waiting` waiters in all."""
        return self.until(
            lambda: len(self.table) >= flights and self.table.waiting() >= waiting, timeout_s
        )

    def readers(self, flight: Flight[Any], n: int, timeout_s: float = 30) -> bool:
        """Until exactly `n` readers read `flight`."""
        return self.until(lambda: flight.readers == n, timeout_s)

    def empty(self, timeout_s: float = 30) -> bool:
        """Until no flight is in progress."""
        return self.until(lambda: len(self.table) == 0, timeout_s)

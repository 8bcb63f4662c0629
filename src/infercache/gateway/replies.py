"""An answer as the reply the client asked for: plain values the routes turn into HTTP.

replay(done, body, adapter, hit_usage)     a settled answer (a hit, or a miss's answer)
  headers: which layer answered (completion.completion_headers); a hit (a coalesced
           answer too) reports the usage `hit_usage` says (hit_usage.py), with the
           tokens it saved in `x-infercache-saved-tokens`
  not streamed → `JSONReply` (a hit's stored bytes as they are, when nothing changed them)
  streamed     → `StreamReply`: the answer replayed as the endpoint's events, then its end
stream(miss, flight, entry, adapter, mirror, hit_usage)   a miss answered live
  waits for the flight's first event (an upstream refusal raises here, so it keeps its
  own HTTP status), then the flight's chunks as the endpoint's writer frames them, then
  the end; an error event when the answer fails midway; a coalesced reader's usage is a
  hit's. The request's record closes when the stream ends (499: the client left first),
  and the whole answer goes to shadow traffic (`mirror`) once it is complete.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Callable
from contextlib import aclosing
from dataclasses import dataclass
from typing import Any

from infercache.completion import Completion, Layer, completion_headers, layer_headers
from infercache.errors import InfercacheError, UpstreamError
from infercache.gateway.endpoints import CachedEndpoint
from infercache.gateway.requestlog import LogEntry
from infercache.hit_usage import HitUsage, served_hit
from infercache.http_errors import INTERNAL_ERROR
from infercache.miss import Miss
from infercache.miss_flight import MissFlight

log = logging.getLogger(__name__)

Mirror = Callable[[dict[str, Any]], None]  # an answer to shadow traffic (version_steps.py)


@dataclass(frozen=True, slots=True)
class JSONReply:
    status: int
    body: dict[str, Any]
    headers: dict[str, str]
    raw: bytes | None = None  # `body` as JSON already (a hit's stored bytes)


@dataclass(frozen=True, slots=True)
class StreamReply:
    headers: dict[str, str]
    events: AsyncIterator[bytes]


def replay(
    done: Completion, body: dict[str, Any], adapter: CachedEndpoint, hit_usage: HitUsage
) -> JSONReply | StreamReply:
    """A settled answer as a reply (the module docstring)."""
    headers = completion_headers(done)
    response, raw = done.response, done.raw
    if done.layer in (Layer.EXACT, Layer.SEMANTIC):
        response, saved, raw = served_hit(response, hit_usage, raw)
        headers.update(saved)
    if body.get("stream") is not True:
        return JSONReply(200, response, headers, raw)
    writer = adapter.writer(body)

    async def events() -> AsyncIterator[bytes]:
        for event in writer.replay(response):
            yield event
        yield writer.end

    return StreamReply(headers, events())


async def stream(
    miss: Miss,
    flight: MissFlight[Completion],
    entry: LogEntry,
    adapter: CachedEndpoint,
    mirror: Mirror | None,
    hit_usage: HitUsage,
) -> StreamReply:
    """A miss answered live (the module docstring)."""
    coalesced = await flight.start_stream()  # raises an upstream refusal
    if coalesced:
        headers = layer_headers(Layer.EXACT, age_s=0.0, coalesced=True)
    else:
        headers = layer_headers(miss.layer)
    events = _events(miss, flight, entry, adapter, coalesced, mirror, hit_usage)
    return StreamReply(headers, events)


async def _events(
    miss: Miss,
    flight: MissFlight[Completion],
    entry: LogEntry,
    adapter: CachedEndpoint,
    coalesced: bool,
    mirror: Mirror | None,
    hit_usage: HitUsage,
) -> AsyncIterator[bytes]:
    writer = adapter.writer(miss.request.body)
    done: Completion | None = None
    try:
        async with aclosing(flight.chunks(adapter.chunks)) as chunks:
            async for chunk in chunks:
                if coalesced:  # a hit: its usage as the hit_usage setting says
                    chunk = adapter.hit_chunk(chunk, hit_usage)
                event = writer.event(chunk)
                if event is not None:
                    yield event
        done = flight.flight.outcome()
        yield writer.end
        if mirror is not None:
            mirror(done.response)
    except UpstreamError as exc:  # cut off upstream, or every other reader left
        yield writer.error(exc)
    except Exception:  # logged; the client gets an error event
        log.exception("the answer for %s failed mid-stream", miss.flight_key)
        yield writer.error(InfercacheError(INTERNAL_ERROR))
    finally:
        entry.close(
            status=200 if done is not None else 499,
            response=done.response if done is not None else None,
            upstream_s=done.upstream_s if done is not None else None,
        )

"""`map_aiohttp_errors`, the upstream client's one error boundary: aiohttp's failures become
ours, each with its cause kept, and nothing else is touched."""

from __future__ import annotations

import aiohttp
import orjson
import pytest

from infercache.errors import UpstreamError, UpstreamUnavailableError
from infercache.gateway.upstream_errors import map_aiohttp_errors


@pytest.mark.parametrize(
    ("raised", "answering", "expected", "message"),
    [
        (aiohttp.ClientConnectionError("refused"), False, UpstreamUnavailableError, "unreachable"),
        (TimeoutError(), False, UpstreamUnavailableError, "unreachable"),
        (aiohttp.ClientPayloadError("cut"), True, UpstreamError, "broke mid-answer"),
        (orjson.JSONDecodeError("bad", "x", 0), False, UpstreamError, "invalid answer"),
        (UnicodeDecodeError("utf-8", b"\xff", 0, 1, "bad"), True, UpstreamError, "invalid answer"),
    ],
)
def test_aiohttp_failures_become_ours_with_their_cause(
    raised: BaseException, answering: bool, expected: type[UpstreamError], message: str
) -> None:
    with (
        pytest.raises(expected, match=message) as caught,
        map_aiohttp_errors("up", answering=answering),
    ):
        raise raised
    assert caught.value.__cause__ is raised
    if not answering and expected is UpstreamError:
        assert not isinstance(caught.value, UpstreamUnavailableError)


def test_anything_else_passes_through_and_a_clean_block_raises_nothing() -> None:
    error = ValueError("ours")
    with pytest.raises(ValueError, match="ours") as caught, map_aiohttp_errors("up"):
        raise error
    assert caught.value is error
    with map_aiohttp_errors("up"):
        pass

"""Stop strings over a stream of text deltas."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given
from hypothesis import strategies as st

from infercache.engine.stop import StopMatcher


def run(stops: list[str], deltas: list[str]) -> tuple[str, bool]:
    m = StopMatcher(stops)
    out = "".join(m.feed(d) for d in deltas)
    return out + m.flush(), m.stopped


def test_stop_string_split_across_deltas_is_trimmed() -> None:
    assert run(["END"], ["Hello E", "N", "D and more"]) == ("Hello ", True)


def test_earliest_of_several_stop_strings_wins() -> None:
    assert run(["zz", "b"], ["a", "bzz"]) == ("a", True)


def test_held_back_text_is_released_when_no_stop_follows() -> None:
    m = StopMatcher(["END"])
    assert m.feed("Hello EN") == "Hello "
    assert m.feed("x") == "ENx"
    assert m.flush() == ""
    assert not m.stopped


def test_text_that_could_start_a_stop_string_is_flushed_at_the_end() -> None:
    assert run(["END"], ["Hello EN"]) == ("Hello EN", False)


def test_empty_stop_strings_are_refused() -> None:
    with pytest.raises(ValueError, match="non-empty"):
        StopMatcher([""])


@given(
    text=st.text(alphabet="abcé😀", max_size=30),
    cuts=st.lists(st.integers(0, 30), max_size=6),
    stop=st.text(alphabet="abé😀", min_size=1, max_size=3),
)
def test_streamed_output_equals_trimming_the_whole_text(
    text: str, cuts: list[int], stop: str
) -> None:
    bounds = sorted({0, len(text), *[c for c in cuts if c <= len(text)]})
    deltas = [text[a:b] for a, b in itertools.pairwise(bounds)]
    out, stopped = run([stop], deltas)
    index = text.find(stop)
    assert stopped == (index >= 0)
    assert out == (text[:index] if index >= 0 else text)

"""Model versions and tag generations: O(1) invalidation, checked on every read.

State lives in the backend's meta, so every process sharing a store agrees:
- `model:{model}` = "{generation}:{version}". `set_model_version(model, v)` with a version other
  than the current one bumps the model's generation counter and writes the new token, one O(1)
  write. An entry records the token current when its request was looked up; a read whose token
  differs is a `stale_model_version` miss. The generation makes A → B → A a change too: answers
  stored before the swap to B are not resurrected by swapping back.
- `tag:{tag}` = an integer generation, absent = 0. `invalidate(tags)` increments each tag's
  counter (O(1) per tag). An entry records the generation of each of its tags at lookup time; a
  read where any differs is an `invalidated_tag` miss. Other entries are untouched.

Recording the state seen *before* the upstream call (not at store time) closes the race where a
model swap or an invalidation lands while an answer is being generated: that answer is stored
with the old state and never served.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import NamedTuple

from infercache.stores.base import MetaStore

UNVERSIONED = "0:"  # the token of a model whose version was never set


class VersionView(NamedTuple):
    """The state a lookup saw: the model's version token and each tag's generation."""

    model_version: str
    tags: tuple[tuple[str, int], ...]

    def model_is_current(self, recorded: str) -> bool:
        return recorded == self.model_version

    def tags_are_current(self, recorded: tuple[tuple[str, int], ...]) -> bool:
        return recorded == self.tags


def _model_name(model: str) -> str:
    return f"model:{model}"


def _tag_name(tag: str) -> str:
    return f"tag:{tag}"


def meta_names(model: str, tags: Sequence[str]) -> list[str]:
    """The meta names a view of `model` and `tags` reads (for a combined store read)."""
    return [_model_name(model), *(_tag_name(t) for t in tags)]


def view_from(values: Mapping[str, str], model: str, tags: Sequence[str]) -> VersionView:
    """The view those meta values describe."""
    return VersionView(
        values.get(_model_name(model), UNVERSIONED),
        tuple((t, int(values.get(_tag_name(t), "0"))) for t in tags),
    )


class Versions:
    def __init__(self, meta: MetaStore) -> None:
        self._meta = meta

    def view(self, model: str, tags: Sequence[str]) -> VersionView:
        """One meta read for the model and all tags (`tags` sorted and unique)."""
        return view_from(self._meta.read_meta(meta_names(model, tags)), model, tags)

    def model_version(self, model: str) -> str | None:
        """The version string last set for `model`, or None."""
        token = self._meta.read_meta([_model_name(model)]).get(_model_name(model))
        if token is None:
            return None
        return token.split(":", 1)[1]

    def set_model_version(self, model: str, version: str) -> bool:
        """Make `version` current; True if it changed (older entries are now unreachable)."""
        if not version:
            raise ValueError("a model version must be a non-empty string")
        if self.model_version(model) == version:
            return False
        generation = self._meta.incr_meta(f"modelgen:{model}")
        self._meta.write_meta(_model_name(model), f"{generation}:{version}")
        return True

    def invalidate(self, tags: Iterable[str]) -> int:
        """Bump each tag's generation; return how many tags were invalidated."""
        n = 0
        for tag in set(tags):
            self._meta.incr_meta(_tag_name(tag))
            n += 1
        return n

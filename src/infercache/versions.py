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

- `version:{len(model)}:{model}:{version}` = "retired" | "live", absent = live: several versions
  of one model live at once (a rolling deploy, a canary), each request looked up under the
  version it would be sent to (its `ChatRequest.version`; the exact key carries it, keys.py). A
  versioned request's token is "{generation}@{version}": the model's generation (a
  `set_model_version` still retires every version at once) and the version's label, so two
  versions' answers never meet. `retire_version` flags one version, one O(1) write every
  process sharing the store reads on its next lookup: its entries are not served, not deleted
  on read and not written; `revive_version` clears the flag, and the entries still within their
  TTL are hits again at once (a rollback). `relabel` names the model's current version without
  retiring anything (what `model_version` answers once every replica serves one version).

Recording the state seen *before* the upstream call (not at store time) closes the race where a
model swap or an invalidation lands while an answer is being generated: that answer is stored
with the old state and never served.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import NamedTuple

from infercache.stores.base import MetaStore

UNVERSIONED = "0:"  # the token of a model whose version was never set
RETIRED = "retired"
LIVE = "live"


class VersionView(NamedTuple):
    """The state a lookup saw: the model's version token, each tag's generation, and whether
    the version the request was looked up under is retired."""

    model_version: str
    tags: tuple[tuple[str, int], ...]
    retired: bool = False

    def model_is_current(self, recorded: str) -> bool:
        return recorded == self.model_version

    def tags_are_current(self, recorded: tuple[tuple[str, int], ...]) -> bool:
        return recorded == self.tags


def _model_name(model: str) -> str:
    return f"model:{model}"


def _tag_name(tag: str) -> str:
    return f"tag:{tag}"


def version_name(model: str, version: str) -> str:
    """The meta name of one version's state (the model's length first: unambiguous)."""
    return f"version:{len(model)}:{model}:{version}"


def generation_of(token: str) -> int:
    """The model generation a token carries ("{g}:{label}" or "{g}@{version}")."""
    digits = token[: len(token) - len(token.lstrip("0123456789"))]
    return int(digits) if digits else 0


def meta_names(model: str, tags: Sequence[str], version: str | None = None) -> list[str]:
    """The meta names a view of `model` (at `version`) and `tags` reads (one store read)."""
    names = [_model_name(model), *(_tag_name(t) for t in tags)]
    if version is not None:
        names.append(version_name(model, version))
    return names


def view_from(
    values: Mapping[str, str], model: str, tags: Sequence[str], version: str | None = None
) -> VersionView:
    """The view those meta values describe."""
    token = values.get(_model_name(model), UNVERSIONED)
    generations = tuple((t, int(values.get(_tag_name(t), "0"))) for t in tags)
    if version is None:
        return VersionView(token, generations)
    retired = values.get(version_name(model, version)) == RETIRED
    return VersionView(f"{generation_of(token)}@{version}", generations, retired)


class Versions:
    def __init__(self, meta: MetaStore) -> None:
        self._meta = meta

    def view(self, model: str, tags: Sequence[str], version: str | None = None) -> VersionView:
        """One meta read for the model (at `version`) and all tags (sorted and unique)."""
        names = meta_names(model, tags, version)
        return view_from(self._meta.read_meta(names), model, tags, version)

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

    def retire_version(self, model: str, version: str) -> bool:
        """Stop serving `version`'s entries (kept: `revive_version` brings back the fresh ones);
        True if it was live."""
        return self._flag(model, version, RETIRED)

    def revive_version(self, model: str, version: str) -> bool:
        """Serve `version`'s entries again (those still within their TTL); True if it was
        retired."""
        return self._flag(model, version, LIVE)

    def retired(self, model: str, versions: Sequence[str]) -> set[str]:
        """Which of `versions` are retired (one meta read)."""
        values = self._meta.read_meta([version_name(model, v) for v in versions])
        return {v for v in versions if values.get(version_name(model, v)) == RETIRED}

    def relabel(self, model: str, version: str) -> bool:
        """Name `version` the model's current one ("": none, several are live), keeping its
        generation: nothing is retired (versioned entries carry only the generation); True if
        the name changed."""
        name = _model_name(model)
        token = self._meta.read_meta([name]).get(name, UNVERSIONED)
        if token.partition(":")[2] == version:
            return False
        self._meta.write_meta(name, f"{generation_of(token)}:{version}")
        return True

    def _flag(self, model: str, version: str, state: str) -> bool:
        if not version:
            raise ValueError("a model version must be a non-empty string")
        name = version_name(model, version)
        was = self._meta.read_meta([name]).get(name, LIVE)
        if was == state:
            return False
        self._meta.write_meta(name, state)
        return True

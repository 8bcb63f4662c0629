"""Is a stored entry fresh? The one judge every layer asks (the exact layer, and through it the
semantic layer's candidates; the embeddings cache), on the injected clock.

    stale_reason(entry, view, now_s): why the entry is gone for every request, or None
      EXPIRED               its TTL ran out (`expires_at_s`)
      STALE_MODEL_VERSION   it was produced under another model version than the one current
                            when the request was looked up (a swap since: versions.py)
      INVALIDATED_TAG       a tag it depends on was invalidated since it was stored
      → the caller deletes it (lazy reclamation)
    too_old(entry, now_s, max_age_s): older than one request's `max_age_s`: a miss (EXPIRED)
      for that request only; the entry stays fresh for the others and is kept

Pure: the view is what the request's lookup read (versions.py), the time is the caller's clock.
"""

from __future__ import annotations

from infercache.metrics import MissReason
from infercache.stores.base import Entry
from infercache.versions import VersionView


def stale_reason(entry: Entry, view: VersionView, now_s: float) -> MissReason | None:
    if now_s >= entry.expires_at_s:
        return MissReason.EXPIRED
    if not view.model_is_current(entry.model_version):
        return MissReason.STALE_MODEL_VERSION
    if not view.tags_are_current(entry.tags):
        return MissReason.INVALIDATED_TAG
    return None


def too_old(entry: Entry, now_s: float, max_age_s: float | None) -> bool:
    return max_age_s is not None and now_s - entry.created_at_s > max_age_s

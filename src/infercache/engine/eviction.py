"""Which evictable leaf of the radix tree (radix.py) goes first: the one whose
`EvictionPolicy.priority` is lowest. `LRUPolicy`, the default, puts the least recently matched
or inserted first (SGLang's radix cache's default too); a policy sees a node only through what
it reads (`Recency`), so it stands apart from the tree."""

from __future__ import annotations

from typing import Protocol


class Recency(Protocol):
    @property
    def last_access(self) -> float:
        """When the node was last matched or inserted (the tree's logical clock)."""
        ...


class EvictionPolicy(Protocol):
    def priority(self, node: Recency) -> float:
        """Evictable leaves with the lowest priority go first."""
        ...


class LRUPolicy:
    """Least recently matched or inserted first."""

    def priority(self, node: Recency) -> float:
        return node.last_access

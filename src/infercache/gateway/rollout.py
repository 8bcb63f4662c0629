"""A rollout declared to the gateway: which upstreams carry the new version, what share of the
traffic they take (a canary), what share is mirrored to them (shadow). Pure.

    Rollout(canary=(upstream names...), share=0.1, shadow=0.0, sticky="tenant", version=None)

Assignment is sticky and hash-based, so every gateway agrees without sharing any state but the
declaration: a request's *unit* is its tenant (`sticky="tenant"`: a canary's users are a stable
set, and every request of a tenant goes to one version) or its tenant and conversation
(`sticky="conversation"`, for one tenant of many users: the conversation is its opening, the
messages up to and including the first user message, so each later turn hashes the same and a
conversation never changes version mid-way). The unit's bucket is `sha256(salt, unit)` read
as a fraction of 2^64, the salt being the declared `version` (else the canary's upstream
names), and the unit is on the canary when its bucket < `share`. Raising the share only adds
units to the canary (those already on it stay); lowering it only takes them off.

Shadow: a request of the stable arm is mirrored to the canary upstreams when its own bucket
(over the tenant and the whole body) is < `shadow` (1.0: every one); the mirrored answer is
recorded and compared, never served or cached (shadow_mirror.py). `share=0` with `shadow>0`
is a pure shadow: the canary upstreams take no user traffic.

`version`: the label the canary upstreams' answers are stored under when they report no version
of their own (an admin-declared version, replica_versions.py); None: whatever they report.
A declaration is stored in the cache store as JSON (`to_json`/`from_json`), so every gateway on
it serves the same rollout (rollout_control.py).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from enum import StrEnum
from typing import Any

from infercache.errors import InvalidRequestError

STICKY = ("tenant", "conversation")


class Arm(StrEnum):
    NONE = ""  # no rollout
    STABLE = "stable"
    CANARY = "canary"


@dataclass(frozen=True, slots=True)
class Rollout:
    canary: tuple[str, ...]
    share: float = 0.0
    shadow: float = 0.0
    sticky: str = "tenant"
    version: str | None = None

    def __post_init__(self) -> None:
        if not self.canary or not all(isinstance(c, str) and c for c in self.canary):
            raise InvalidRequestError(
                "a rollout names its canary upstreams: a non-empty list of URLs", param="canary"
            )
        for name in ("share", "shadow"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise InvalidRequestError(f"{name!r} must be a number in [0, 1]", param=name)
            if not 0.0 <= value <= 1.0:
                raise InvalidRequestError(f"{name!r} must be in [0, 1], got {value}", param=name)
        if self.sticky not in STICKY:
            raise InvalidRequestError(f"'sticky' must be one of {STICKY}", param="sticky")
        if self.version is not None and (not isinstance(self.version, str) or not self.version):
            raise InvalidRequestError("'version' must be a non-empty string", param="version")
        object.__setattr__(self, "canary", tuple(sorted(set(self.canary))))

    @classmethod
    def of(cls, body: Mapping[str, Any]) -> Rollout:
        """From a declaration (the admin API's body, the stored JSON); a 400 when it is bad."""
        unknown = set(body) - {"canary", "share", "shadow", "sticky", "version"}
        if unknown:
            raise InvalidRequestError(f"unknown rollout field(s) {sorted(unknown)}")
        canary = body.get("canary")
        if isinstance(canary, str):
            canary = [canary]
        if not isinstance(canary, list):
            raise InvalidRequestError("'canary' must be a list of upstream URLs", param="canary")
        return cls(
            tuple(canary),
            body.get("share", 0.0),
            body.get("shadow", 0.0),
            body.get("sticky", "tenant"),
            body.get("version"),
        )

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> Rollout | None:
        return cls.of(json.loads(text)) if text else None

    @property
    def salt(self) -> bytes:
        return (self.version or "\x00".join(self.canary)).encode()

    def arm(self, tenant: str, body: Mapping[str, Any]) -> Arm:
        """The arm `body` from `tenant` is served by: sticky per unit (module docstring)."""
        if self.share <= 0.0:
            return Arm.STABLE
        unit = tenant if self.sticky == "tenant" else f"{tenant}\x00{conversation(body)}"
        return Arm.CANARY if bucket(self.salt, unit) < self.share else Arm.STABLE

    def mirrored(self, tenant: str, body: Mapping[str, Any]) -> bool:
        """Whether a stable-arm request is mirrored to the canary (shadow traffic)."""
        if self.shadow <= 0.0:
            return False
        if self.shadow >= 1.0:
            return True
        text = json.dumps(body, sort_keys=True, separators=(",", ":"), default=str)
        return bucket(self.salt + b"\x00shadow", f"{tenant}\x00{text}") < self.shadow


def conversation(body: Mapping[str, Any]) -> str:
    """A conversation's identity: its opening (the messages up to and including the first user
    message), the same on every later turn; a completions prompt is its own."""
    messages = body.get("messages")
    if not isinstance(messages, list):
        return json.dumps(body.get("prompt"), sort_keys=True, default=str)
    opening = []
    for message in messages:
        opening.append(message)
        if isinstance(message, Mapping) and message.get("role") == "user":
            break
    return json.dumps(opening, sort_keys=True, separators=(",", ":"), default=str)


def bucket(salt: bytes, unit: str) -> float:
    """`unit`'s place in [0, 1), the same in every process."""
    digest = hashlib.sha256(salt + b"\x00" + unit.encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2.0**64

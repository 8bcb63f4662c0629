"""When a new `system_fingerprint` means a new model version, and when it does not.

A provider answers one model with several fingerprints at once (OpenAI: one per backend
configuration, e.g. fp_76f018034d ×7, fp_c5162df67e ×2, fp_9c4936e070 ×1 in ten calls to one
model). Several fingerprints of one model are one version; the cache keeps hitting across them.
For an upstream that offers nothing but fingerprints, a version change is a fingerprint never
seen before that *displaces* the earlier ones for a sustained window:

    epoch        starts when the watch first sees the model, after each displacement, and
                 whenever the store's version token moves ahead of the one the epoch began
                 under (a version set by /v1/models, the admin API, the CLI or another gateway:
                 that change was recorded already, so the fingerprints after it are its own)
    founders     the fingerprints of the epoch's first `window.answers` answers
    displacement no founder answered for `window.seconds` AND at least `window.answers`
                 answers came since the last founder answer, all from newcomers: the
                 newcomers are the new version (labelled by the most frequent of them)

Both conditions guard against chance: at high traffic `seconds` of silence means hundreds of
newcomer answers in a row; at low traffic `answers` means several in a row however far apart.
A rare co-live fingerprint that missed the founding answers is a newcomer, but it never
displaces the founders while they still answer. Pure: no store, no clock of its own (the caller
passes the time); not thread-safe (the tracker holds a lock).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from infercache.versions import generation_of


@dataclass(frozen=True, slots=True)
class SwapWindow:
    """How long, and over how many answers, newcomers must have displaced the founders."""

    seconds: float = 60.0
    answers: int = 20

    def __post_init__(self) -> None:
        if self.seconds < 0 or self.answers < 1:
            raise ValueError(f"a fingerprint swap window needs seconds >= 0, answers >= 1: {self}")


class Displacement(NamedTuple):
    """The evidence for a version change from fingerprints alone."""

    version: str  # the most frequent newcomer: the new version's label
    displaced: tuple[str, ...]  # the founders, silent for `silent_s`
    newcomers: tuple[tuple[str, int], ...]  # each newcomer and its answers since then
    silent_s: float
    answers: int

    def describe(self) -> str:
        seen = ", ".join(f"{fp} x{n}" for fp, n in self.newcomers)
        return (
            f"{seen} displaced {', '.join(self.displaced)}: no answer from them for "
            f"{self.silent_s:.0f} s over {self.answers} answers"
        )


def token_generation(token: str) -> int:
    """The generation of a model version token, `generation:version` or `generation@version`
    (versions.py)."""
    return generation_of(token)


@dataclass(slots=True)
class FingerprintWatch:
    """One model's fingerprints in the current epoch (see the module docstring)."""

    window: SwapWindow
    token: str | None = None  # the store's version token the epoch began under
    started: bool = False
    founders: set[str] = field(default_factory=set)
    founding_left: int = 0
    answers: Counter[str] = field(default_factory=Counter)
    last_seen_s: dict[str, float] = field(default_factory=dict)
    last_founder_s: float = 0.0
    newcomers: Counter[str] = field(default_factory=Counter)  # since the last founder answer

    def observe(self, fingerprint: str, now_s: float, token: str | None) -> Displacement | None:
        """Note one answer's fingerprint; the displacement it completes, if any. `token`: the
        store's version token the answer's lookup saw (None: the store was not read)."""
        if not self.started or (
            token is not None and token_generation(token) > token_generation(self.token or "0:")
        ):
            self._new_epoch(token, founders=())
            self.started = True
        self.answers[fingerprint] += 1
        self.last_seen_s[fingerprint] = now_s
        if self.founding_left > 0 or fingerprint in self.founders:  # a founder answered
            if self.founding_left > 0:
                self.founders.add(fingerprint)
                self.founding_left -= 1
            self.last_founder_s = now_s
            self.newcomers.clear()
            return None
        self.newcomers[fingerprint] += 1
        count = sum(self.newcomers.values())
        silent_s = now_s - self.last_founder_s
        if count < self.window.answers or silent_s < self.window.seconds:
            return None
        ranked = sorted(self.newcomers.items(), key=lambda kv: (-kv[1], kv[0]))
        return Displacement(
            ranked[0][0], tuple(sorted(self.founders)), tuple(ranked), silent_s, count
        )

    def swapped(self, displacement: Displacement, token: str | None, now_s: float) -> None:
        """The displacement was recorded as `token`: its newcomers found the next epoch."""
        self._new_epoch(token, founders=(fp for fp, _ in displacement.newcomers))
        self.last_founder_s = now_s

    def _new_epoch(self, token: str | None, founders: Any) -> None:
        self.token = token
        self.founders = set(founders)
        self.founding_left = 0 if self.founders else self.window.answers
        self.newcomers.clear()
        self.answers.clear()
        self.last_seen_s.clear()

    def snapshot(self, now_s: float) -> dict[str, Any]:
        """For /stats: every fingerprint of the epoch with its answers and age."""
        return {
            "token": self.token,
            "fingerprints": {
                fp: {
                    "answers": n,
                    "last_seen_s_ago": round(now_s - self.last_seen_s[fp], 1),
                    "founder": fp in self.founders,
                }
                for fp, n in self.answers.most_common()
            },
            "newcomer_answers_since_founder": sum(self.newcomers.values()),
        }

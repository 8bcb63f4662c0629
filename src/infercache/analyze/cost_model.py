"""Upstream seconds of a request: rates fitted from the log's own timings, else a named profile.

Model. A request that goes upstream takes

    upstream_s = overhead_s + uncached prompt tokens / prefill_tokens_per_s
                            + completion tokens / decode_tokens_per_s

and prefix reuse saves `reused tokens / prefill_tokens_per_s` of it (the time to first token).

Fit (`RateFit`), per model, over the records that went upstream (live layer `miss`, `bypass` or
`uncacheable`) and carry a timing; "uncached" subtracts the record's `cached_tokens`:
- with a time to first token (`ttft_ms`): least squares of the TTFT on [1, uncached prompt]
  (overhead, 1/prefill), and of upstream − TTFT on [completion] (1/decode);
- without: least squares of the upstream seconds (`upstream_ms`, else `latency_ms`) on
  [1, uncached prompt, completion].
A fit is used when it has at least `min_records` records, both rates come out positive and the
prompt's coefficient lies at least 3 standard errors from zero; otherwise the prompt length
explains none of the time, prefill savings would be a guess, and the model keeps its profile
(the report says why). Only sufficient statistics are kept (XᵀX, Xᵀy, yᵀy per model).

Profiles (`--upstream-profile`): `provider`, a hosted API (assumed figures, typical of hosted
chat models' published latencies: log timings to fit your own); `engine`, the built-in engine
as measured on this project's machine (bench/README.md, "Prefix reuse"); `P,D`, prefill P and
decode D tokens a second. `auto` (the default): fitted where the log allows, else `engine` for
the packaged engine's model and `provider` for any other.

Seconds are needed before the fit is final, so the replay keeps a `SecondsLedger`: measured
seconds as they are, the rest as token sums per model, priced once the rates are known.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

import numpy as np

from infercache.errors import ConfigError

ENGINE_MODEL_IDS = frozenset({"SmolLM2-135M-Instruct", "HuggingFaceTB/SmolLM2-135M-Instruct"})


@dataclass(frozen=True, slots=True)
class UpstreamRates:
    name: str  # "provider", "engine", "custom", or "fitted"
    overhead_s: float
    prefill_tokens_per_s: float
    decode_tokens_per_s: float

    def __post_init__(self) -> None:
        if not (
            self.overhead_s >= 0 and self.prefill_tokens_per_s > 0 and self.decode_tokens_per_s > 0
        ):
            raise ConfigError(f"upstream rates need positive rates, got {self}")

    def upstream_s(self, prompt_tokens: int, completion_tokens: int) -> float:
        return self.overhead_s + self.prefill_s(prompt_tokens) + self.decode_s(completion_tokens)

    def prefill_s(self, tokens: float) -> float:
        return tokens / self.prefill_tokens_per_s

    def decode_s(self, tokens: float) -> float:
        return tokens / self.decode_tokens_per_s

    def describe(self) -> str:
        return (
            f"{self.overhead_s:g} s + prompt at {self.prefill_tokens_per_s:,.0f} tok/s + "
            f"completion at {self.decode_tokens_per_s:,.1f} tok/s"
        )


PROVIDER = UpstreamRates("provider", 0.4, 15_000.0, 80.0)
ENGINE = UpstreamRates("engine", 0.05, 780.0, 26.0)  # bench/README.md, "Prefix reuse"
PROFILES = {"provider": PROVIDER, "engine": ENGINE}
PROFILE_HELP = (
    "auto (fit rates from the log's timings, else engine for the packaged model and provider "
    "for others), provider, engine, or PREFILL_TOK_S,DECODE_TOK_S"
)


@dataclass(frozen=True, slots=True)
class UpstreamProfile:
    """The `--upstream-profile` choice: `rates` None means auto."""

    rates: UpstreamRates | None = None

    @classmethod
    def parse(cls, spec: str) -> UpstreamProfile:
        spec = spec.strip()
        if spec == "auto":
            return cls(None)
        if spec in PROFILES:
            return cls(PROFILES[spec])
        parts = spec.split(",")
        try:
            prefill, decode = (float(p) for p in parts)
        except ValueError:
            raise ConfigError(f"--upstream-profile {spec!r}: expected {PROFILE_HELP}") from None
        return cls(UpstreamRates("custom", 0.3, prefill, decode))

    def default_for(self, model: str) -> UpstreamRates:
        if self.rates is not None:
            return self.rates
        return ENGINE if model in ENGINE_MODEL_IDS else PROVIDER


@dataclass(frozen=True, slots=True)
class Timing:
    """One upstream call's timing, as the log gives it."""

    upstream_s: float
    ttft_s: float | None
    uncached_prompt_tokens: int
    completion_tokens: int


class _Sums:
    """XᵀX, Xᵀy and yᵀy of one least-squares problem, accumulated a row at a time."""

    def __init__(self, columns: int) -> None:
        self.xtx = np.zeros((columns, columns))
        self.xty = np.zeros(columns)
        self.yty = 0.0
        self.n = 0

    def add(self, x: tuple[float, ...], y: float) -> None:
        row = np.asarray(x)
        self.xtx += np.outer(row, row)
        self.xty += row * y
        self.yty += y * y
        self.n += 1

    def solve(self) -> tuple[np.ndarray, np.ndarray] | None:
        """(coefficients, their standard errors), or None when singular or too few rows."""
        p = len(self.xty)
        if self.n <= p:
            return None
        try:
            inverse = np.linalg.inv(self.xtx)
        except np.linalg.LinAlgError:
            return None
        beta = inverse @ self.xty
        rss = max(0.0, float(self.yty - beta @ self.xty))
        errors = np.sqrt(np.maximum(np.diag(inverse) * rss / (self.n - p), 0.0))
        if not np.all(np.isfinite(beta)):
            return None
        return beta, errors


@dataclass(frozen=True, slots=True)
class ModelRates:
    """The rates one model is priced at, and where they come from."""

    model: str
    rates: UpstreamRates
    source: str  # "fitted on N timed records (with TTFT)" or "profile provider: why"
    fitted: bool
    timed_records: int


class RateFit:
    """Per-model rates from logged timings (see the module docstring)."""

    def __init__(self, *, min_records: int = 30, min_t: float = 3.0) -> None:
        self._min_records = min_records
        self._min_t = min_t
        self._plain: dict[str, _Sums] = {}
        self._ttft: dict[str, tuple[_Sums, _Sums]] = {}

    def add(self, model: str, timing: Timing) -> None:
        if timing.upstream_s <= 0:
            return
        p, c = float(timing.uncached_prompt_tokens), float(timing.completion_tokens)
        if timing.ttft_s is not None and 0 < timing.ttft_s <= timing.upstream_s:
            first, rest = self._ttft.setdefault(model, (_Sums(2), _Sums(1)))
            first.add((1.0, p), timing.ttft_s)
            rest.add((c,), timing.upstream_s - timing.ttft_s)
        else:
            self._plain.setdefault(model, _Sums(3)).add((1.0, p, c), timing.upstream_s)

    def records(self, model: str) -> int:
        plain = self._plain.get(model)
        ttft = self._ttft.get(model)
        return (plain.n if plain else 0) + (ttft[0].n if ttft else 0)

    def fit(self, model: str) -> tuple[UpstreamRates | None, str]:
        """(fitted rates, how) or (None, why not)."""
        ttft = self._ttft.get(model)
        if ttft is not None and ttft[0].n >= self._min_records:
            first, rest = ttft[0].solve(), ttft[1].solve()
            if first is None or rest is None:
                return None, "the timings are degenerate (every prompt the same length?)"
            (overhead, per_prompt), (_, prompt_error) = first
            (per_completion,), _ = rest
            how = f"fitted on {ttft[0].n:,} timed records (with TTFT)"
            return self._checked(overhead, per_prompt, prompt_error, per_completion, how)
        plain = self._plain.get(model)
        n = plain.n if plain is not None else 0
        if plain is None or n < self._min_records:
            return None, f"{n} timed upstream record(s), fewer than {self._min_records}"
        solved = plain.solve()
        if solved is None:
            return None, "the timings are degenerate (every prompt the same length?)"
        (overhead, per_prompt, per_completion), (_, prompt_error, _) = solved
        how = f"fitted on {n:,} timed records"
        return self._checked(overhead, per_prompt, prompt_error, per_completion, how)

    def _checked(
        self, overhead: float, per_prompt: float, error: float, per_completion: float, how: str
    ) -> tuple[UpstreamRates | None, str]:
        if per_prompt <= 0 or per_completion <= 0:
            return None, "the fit gave a non-positive prefill or decode rate"
        if error > 0 and per_prompt / error < self._min_t:
            return None, (
                f"prompt length explains too little of the time (t = {per_prompt / error:.1f})"
            )
        rates = UpstreamRates("fitted", max(0.0, overhead), 1 / per_prompt, 1 / per_completion)
        return rates, how


@dataclass(frozen=True, slots=True)
class CostModel:
    """The rates each model is priced at (`rates(model)`), decided once the log is read."""

    by_model: Mapping[str, ModelRates]
    profile: UpstreamProfile

    @classmethod
    def decide(cls, fit: RateFit, models: Iterable[str], profile: UpstreamProfile) -> CostModel:
        out: dict[str, ModelRates] = {}
        for model in models:
            rates, how = fit.fit(model) if profile.rates is None else (None, "profile chosen")
            timed = fit.records(model)
            if rates is not None:
                out[model] = ModelRates(model, rates, how, True, timed)
                continue
            chosen = profile.default_for(model)
            why = "" if profile.rates is not None else f": {how}"
            out[model] = ModelRates(model, chosen, f"profile {chosen.name}{why}", False, timed)
        return cls(out, profile)

    def rates(self, model: str) -> UpstreamRates:
        found = self.by_model.get(model)
        return found.rates if found is not None else self.profile.default_for(model)


@dataclass
class SecondsLedger:
    """Upstream seconds, priced when the rates are known (see the module docstring)."""

    measured_s: float = 0.0
    estimated: dict[str, list[float]] = field(default_factory=dict)  # [requests, prompt, compl.]
    prefill_tokens: dict[str, float] = field(default_factory=dict)

    def add_call(
        self, model: str, measured_s: float | None, prompt_tokens: int, completion_tokens: int
    ) -> None:
        """One whole upstream call: measured, or to estimate from its tokens."""
        if measured_s is not None:
            self.measured_s += measured_s
            return
        row = self.estimated.setdefault(model, [0.0, 0.0, 0.0])
        row[0] += 1
        row[1] += prompt_tokens
        row[2] += completion_tokens

    def add_prefill(self, model: str, tokens: int) -> None:
        """Prefill time of `tokens` prompt tokens (what prefix reuse saves)."""
        self.prefill_tokens[model] = self.prefill_tokens.get(model, 0.0) + tokens

    def total_s(self, cost: CostModel) -> float:
        total = self.measured_s
        for model, (n, prompt, completion) in self.estimated.items():
            r = cost.rates(model)
            total += n * r.overhead_s + r.prefill_s(prompt) + r.decode_s(completion)
        for model, tokens in self.prefill_tokens.items():
            total += cost.rates(model).prefill_s(tokens)
        return total

    @property
    def estimated_calls(self) -> int:
        return int(sum(row[0] for row in self.estimated.values()))


def finite_or_none(value: float) -> float | None:
    return value if math.isfinite(value) else None

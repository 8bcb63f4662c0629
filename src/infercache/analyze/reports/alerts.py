"""`--format alerts`: each recommended strategy's alarm as a Prometheus alerting rule on the
gateway's own metrics (`GET /metrics`, metrics.py `to_prometheus`).

The alarm (recommend.py) is a floor under a rate measured on this traffic:
- `hit_rate` (exact, semantic): answered lookups / lookups,
  sum(rate(hits{strategy=S}[W])) / sum(rate(lookups{strategy=S}[W]));
- `token_hit_rate` (prefix): reused / prompt tokens reaching the engine,
  sum(rate(saved_prompt_tokens{strategy="prefix"}[W])) / sum(rate(lookup_prompt_tokens{...}[W])).
A rule fires when the ratio stays under the floor for `for_duration` (30 minutes) over a window
`W` of one hour; with no traffic the ratio is NaN, which never compares true, so idle hours
stay quiet. The metric names live in `GATEWAY_METRICS` and nowhere else: they are the names
prometheus.py gives the gateway's counters (tests/analyze/test_alerts.py checks them against
the exposition).
Besides, one rule per upstream of the provider prompt cache section (provider_prompt_cache.py):
its net money over `W`, what its reads saved minus what its writes cost beyond input,
  sum(rate(saved_usd{upstream=U}[W])) - sum(rate(write_premium_usd{upstream=U}[W])) < 0,
the gateway's per-upstream counters (`PROMPT_CACHE_METRICS`, gateway/prefix_usage.py): it
fires while the provider's cache costs more than it saves, with the alarm line `/stats` shows.
The output is YAML as Prometheus reads it (`rule_files`); strings are written as JSON strings,
which YAML reads unchanged.
"""

from __future__ import annotations

import json
from typing import Any

from infercache.analyze.reports.document import Report
from infercache.analyze.reports.prompt_cache_table import net_cell

GATEWAY_METRICS = {
    "lookups": "infercache_lookups_total",
    "hits": "infercache_hits_total",
    "prompt_tokens_seen": "infercache_lookup_prompt_tokens_total",
    "prompt_tokens_saved": "infercache_saved_prompt_tokens_total",
}
PROMPT_CACHE_METRICS = {
    "saved_usd": "infercache_prompt_cache_saved_usd_total",
    "write_premium_usd": "infercache_prompt_cache_write_premium_usd_total",
}
RATIOS = {  # alarm metric → (numerator, denominator) in GATEWAY_METRICS
    "hit_rate": ("hits", "lookups"),
    "token_hit_rate": ("prompt_tokens_saved", "prompt_tokens_seen"),
}
WINDOW = "1h"
FOR_DURATION = "30m"


def expression(strategy: str, metric: str, floor: float, *, window: str = WINDOW) -> str:
    """The PromQL of one alarm: the ratio over `window`, under `floor`."""
    numerator, denominator = (GATEWAY_METRICS[m] for m in RATIOS[metric])
    selector = f'{{strategy="{strategy}"}}'
    return (
        f"sum(rate({numerator}{selector}[{window}])) / "
        f"sum(rate({denominator}{selector}[{window}])) < {floor:.4f}"
    )


def rules(report: Report) -> list[dict[str, Any]]:
    out = []
    for alarm in report.recommendation.alarms:
        name, metric = alarm.strategy, alarm.metric
        out.append(
            {
                "alert": f"InfercacheLow{name.capitalize()}{_camel(metric)}",
                "expr": expression(name, metric, alarm.alert_below),
                "for": FOR_DURATION,
                "labels": {"severity": "warning", "strategy": name},
                "annotations": {
                    "summary": f"infercache {name} {metric.replace('_', ' ')} under "
                    f"{100 * alarm.alert_below:.1f}% (measured {100 * alarm.expected:.1f}% "
                    "by infercache analyze)",
                    "description": alarm.meaning,
                },
            }
        )
    return out


def prompt_cache_rules(report: Report) -> list[dict[str, Any]]:
    """A rule per upstream whose provider prompt cache the log recorded: its net below 0."""
    section = report.figures.provider_prompt_cache
    if section is None:
        return []
    out = []
    for upstream, figures in section.upstreams.items():
        selector = f"{{upstream={json.dumps(upstream)}}}"
        saved, premium = (f"sum(rate({PROMPT_CACHE_METRICS[m]}{selector}[{WINDOW}]))"
                          for m in ("saved_usd", "write_premium_usd"))  # fmt: skip
        net = figures.total.net_usd
        out.append(
            {
                "alert": "InfercacheProviderPromptCacheLoss",
                "expr": f"{saved} - {premium} < 0",
                "for": FOR_DURATION,
                "labels": {"severity": "warning", "upstream": upstream},
                "annotations": {
                    "summary": f"the provider prompt cache of {upstream} costs more than it "
                    f"saves (net measured by infercache analyze: {net_cell(net)})",
                    "description": LOSS_MEANING,
                },
            }
        )
    return out


LOSS_MEANING = (
    "its prompt-cache writes are not read back within the cache's lifetime; look for a prefix "
    "breaker (a varying value ahead of the shared prompt), breakpoints the client marks on "
    "prompts asked once (try `--anthropic-breakpoints strip` or `inject`), or traffic too "
    "sparse for the cache's lifetime"
)


def _camel(snake: str) -> str:
    return "".join(part.capitalize() for part in snake.split("_"))


def render_alerts(report: Report) -> str:
    found = rules(report) + prompt_cache_rules(report)
    f = report.figures
    lines = [
        "# Prometheus alerting rules from `infercache analyze` "
        f"({f.requests:,} requests of {', '.join(f.inputs.files)})",
        "groups:",
        '  - name: "infercache-analyze"',
        "    rules:" + ("" if found else " []"),
    ]
    for rule in found:
        lines.append(f"      - alert: {json.dumps(rule['alert'])}")
        lines.append(f"        expr: {json.dumps(rule['expr'])}")
        lines.append(f"        for: {json.dumps(rule['for'])}")
        lines.append("        labels:")
        lines += [f"          {k}: {json.dumps(v)}" for k, v in rule["labels"].items()]
        lines.append("        annotations:")
        lines += [
            f"          {k}: {json.dumps(v, ensure_ascii=False)}"
            for k, v in rule["annotations"].items()
        ]
    return "\n".join(lines) + "\n"

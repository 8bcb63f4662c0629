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
The output is YAML as Prometheus reads it (`rule_files`); strings are written as JSON strings,
which YAML reads unchanged.
"""

from __future__ import annotations

import json
from typing import Any

from infercache.analyze.reports.document import Report

GATEWAY_METRICS = {
    "lookups": "infercache_lookups_total",
    "hits": "infercache_hits_total",
    "prompt_tokens_seen": "infercache_lookup_prompt_tokens_total",
    "prompt_tokens_saved": "infercache_saved_prompt_tokens_total",
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


def _camel(snake: str) -> str:
    return "".join(part.capitalize() for part in snake.split("_"))


def render_alerts(report: Report) -> str:
    found = rules(report)
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

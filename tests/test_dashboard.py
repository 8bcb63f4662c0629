"""The Grafana dashboard (deploy/grafana/infercache.json) queries only what is exported: every
metric its PromQL names is in a real gateway's `/metrics` after a mixed workload (the engine's
exposition for the engine row), and every label it groups or filters by is on those metrics."""

from __future__ import annotations

import json
import re
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.observed_gateway import engine_metrics_text, gateway_with_traffic

DASHBOARD = Path(__file__).resolve().parents[1] / "deploy" / "grafana" / "infercache.json"
ENGINE_ROW = "Engine (built-in)"
PROMQL_WORDS = {
    "sum", "avg", "min", "max", "count", "by", "without", "rate", "irate", "increase",
    "histogram_quantile", "label_values", "clamp_min", "topk", "on", "ignoring", "group_left",
}  # fmt: skip
IDENT = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")


def exported(text: str) -> dict[str, set[str]]:
    """Sample name → the label names its samples carry."""
    labels: dict[str, set[str]] = defaultdict(set)
    for fam in text_string_to_metric_families(text):
        for sample in fam.samples:
            labels[sample.name] |= set(sample.labels)
    return dict(labels)


@pytest.fixture(scope="module")
def gateway_names(tmp_path_factory: pytest.TempPathFactory) -> dict[str, set[str]]:
    with gateway_with_traffic(tmp_path_factory.mktemp("gateway")) as observed:
        return exported(observed.metrics_text)


def queries(dashboard: dict[str, Any]) -> Iterator[tuple[str, str, str]]:
    """(row title, panel title, PromQL) for every target and template variable."""
    row = ""
    for panel in dashboard["panels"]:
        if panel["type"] == "row":
            row = panel["title"]
            continue
        for target in panel["targets"]:
            yield row, panel["title"], target["expr"]
    for variable in dashboard["templating"]["list"]:
        if variable["type"] == "query":
            yield "", f"${variable['name']}", variable["query"]["query"]


def metrics_and_labels(expr: str) -> tuple[set[str], set[str]]:
    """The metric names an expression reads, and the label names it groups or filters by."""
    labels = set()
    for matchers in re.findall(r"\{([^}]*)\}", expr):
        labels |= set(re.findall(r"([a-zA-Z_]\w*)\s*=~?", matchers))
    for grouping in re.findall(r"\b(?:by|without)\s*\(([^)]*)\)", expr):
        labels |= {g.strip() for g in grouping.split(",")}
    bare = re.sub(r"\{[^}]*\}|\[[^\]]*\]|\"[^\"]*\"|\b(?:by|without)\s*\([^)]*\)", " ", expr)
    bare = re.sub(r"\$\w+", " ", bare)
    names = {t for t in IDENT.findall(bare) if t not in PROMQL_WORDS}
    names -= labels  # label_values(metric, label): its second argument is a label
    if expr.startswith("label_values("):
        labels.add(expr.rstrip(")").rsplit(",", 1)[1].strip())
        names = {expr[len("label_values(") :].split(",")[0].strip()}
    return names, labels


def test_every_query_names_an_exported_metric_and_label(
    gateway_names: dict[str, set[str]],
) -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    engine_names = exported(engine_metrics_text())
    checked = 0
    for row, title, expr in queries(dashboard):
        available = engine_names if row == ENGINE_ROW else gateway_names
        names, labels = metrics_and_labels(expr)
        assert names, f"{title}: no metric in {expr}"
        missing = names - set(available)
        assert not missing, f"{title}: {sorted(missing)} not exported ({expr})"
        carried = set().union(*(available[n] for n in names))
        assert labels <= carried, f"{title}: labels {sorted(labels - carried)} absent ({expr})"
        if "histogram_quantile" in expr:
            assert "le" in labels, f"{title}: a quantile must keep `le` ({expr})"
            assert all(n.endswith("_bucket") for n in names), expr
        checked += 1
    assert checked >= 25


def test_the_dashboard_shows_savings_latency_traffic_stores_and_the_prefix_cache() -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    used = set().union(*(metrics_and_labels(e)[0] for _, _, e in queries(dashboard)))
    assert {
        "infercache_hits_total",  # hit rate per strategy
        "infercache_lookups_total",
        "infercache_saved_prompt_tokens_total",  # tokens saved
        "infercache_saved_usd_total",  # money saved
        "infercache_request_duration_seconds_bucket",  # hit and miss latency
        "infercache_store_entries",  # store size
        "infercache_store_bytes",
        "infercache_requests_total",  # per tenant and model
        "infercache_prefix_cache_hits_total",  # prefix cache hit rate
        "infercache_prefix_cache_queries_total",
    } <= used
    exprs = [e for _, _, e in queries(dashboard)]
    assert any("by (tenant)" in e for e in exprs)
    assert any('layer=~"exact-hit|semantic-hit|miss"' in e for e in exprs)
    ids = [p["id"] for p in dashboard["panels"]]
    assert len(ids) == len(set(ids))


@pytest.mark.parametrize(
    ("expr", "names", "labels"),
    [
        (
            'sum by (strategy) (rate(infercache_hits_total{model=~"$model"}[$__rate_interval]))',
            {"infercache_hits_total"},
            {"strategy", "model"},
        ),
        (
            "label_values(infercache_requests_total, tenant)",
            {"infercache_requests_total"},
            {"tenant"},
        ),
    ],
)
def test_the_query_reader_finds_metrics_and_labels(
    expr: str, names: set[str], labels: set[str]
) -> None:
    assert metrics_and_labels(expr) == (names, labels)

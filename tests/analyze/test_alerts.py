"""`--format alerts`: each recommended strategy's alarm as a Prometheus alerting rule, on the
metric names the gateway itself exports."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import yaml

from infercache.analyze.reports.alerts import GATEWAY_METRICS
from tests.analyze.generators import short_support_bot
from tests.harness.cli import run_analyze
from tests.observed_gateway import gateway_with_traffic


@pytest.fixture(scope="module")
def exported_names(tmp_path_factory: pytest.TempPathFactory) -> set[str]:
    """Metric names in a real gateway's /metrics text, after a mixed workload."""
    with gateway_with_traffic(tmp_path_factory.mktemp("gateway")) as observed:
        text = observed.metrics_text
    return {line.split("{")[0].split(" ")[0] for line in text.splitlines() if line[:1] != "#"}


def test_each_alarm_is_a_rule_on_the_gateways_own_metrics(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], exported_names: set[str]
) -> None:
    log = short_support_bot(seed=5, n=400).write(tmp_path / "log.jsonl")
    common = ["--tokenizer", "chars4", "--no-semantic"]
    assert run_analyze(str(log), "--format", "alerts", *common) == 0
    rules = yaml.safe_load(capsys.readouterr().out)
    assert run_analyze(str(log), "--format", "json", *common) == 0
    alarms = {
        a["strategy"]: a for a in json.loads(capsys.readouterr().out)["recommendation"]["alarms"]
    }
    [group] = rules["groups"]
    by_strategy = {r["labels"]["strategy"]: r for r in group["rules"]}
    assert set(by_strategy) == set(alarms) == {"exact", "prefix"}
    names = exported_names
    assert set(GATEWAY_METRICS.values()) <= names
    for strategy, rule in by_strategy.items():
        expr = rule["expr"]
        used = set(re.findall(r"infercache_[a-z_]+", expr))
        assert used, expr
        assert used <= names, expr
        floor = float(expr.rsplit("<", 1)[1])
        assert floor == pytest.approx(alarms[strategy]["alert_below"], abs=1e-4)
        assert f'strategy="{strategy}"' in expr
        assert rule["for"] == "30m"
        assert rule["annotations"]["description"] == alarms[strategy]["meaning"]
    assert "infercache_saved_prompt_tokens_total" in by_strategy["prefix"]["expr"]
    assert "hits_total" in by_strategy["exact"]["expr"]


def test_no_strategy_on_gives_an_empty_rule_group(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from tests.analyze.generators import unique_drafts

    log = unique_drafts(seed=1, n=40).write(tmp_path / "log.jsonl")
    assert (
        run_analyze(str(log), "--format", "alerts", "--tokenizer", "chars4", "--no-semantic") == 0
    )
    rules = yaml.safe_load(capsys.readouterr().out)
    assert rules["groups"][0]["rules"] == []

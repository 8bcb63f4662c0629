"""OpenTelemetry: one span per request with the GenAI attributes (the SDK's in-memory
exporter), none of the request's text, and a clear error when the extra is missing."""

from __future__ import annotations

import importlib.util
from typing import Any

import httpx
import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from infercache.errors import ConfigError
from infercache.gateway import tracing
from infercache.gateway.build import build
from infercache.gateway.config import GatewayConfig
from infercache.gateway.tracing import OTelTracer
from infercache.settings import Settings
from tests.gateway.conftest import body
from tests.harness.servers import serve


def test_each_request_is_one_span_with_the_gen_ai_attributes(
    tmp_path: Any, fake: tuple[Any, str]
) -> None:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    _, url = fake
    built = build(
        Settings(data_dir=tmp_path, store_url=f"sqlite:///{tmp_path}/t.db"),
        GatewayConfig(upstreams=(f"{url}/v1",), version_poll_s=None),
        tracer=OTelTracer(provider),
    )
    secret_question = "my account number is 12345678"
    with serve(built.app) as gateway, httpx.Client(base_url=gateway) as client:
        for _ in range(2):
            client.post("/v1/chat/completions", json=body(secret_question))
        client.post("/v1/chat/completions", json={"model": 1})
    spans = exporter.get_finished_spans()
    assert [s.name for s in spans] == ["chat test-model"] * 2 + ["chat 1"]
    miss, hit, bad = (dict(s.attributes or {}) for s in spans)
    assert miss["gen_ai.operation.name"] == "chat"
    assert miss["gen_ai.request.model"] == "test-model"
    assert (miss["infercache.layer"], hit["infercache.layer"]) == ("miss", "exact-hit")
    assert (miss["gen_ai.usage.input_tokens"], miss["gen_ai.usage.output_tokens"]) == (30, 6)
    assert miss["gen_ai.usage.cache_read.input_tokens"] == 0  # the stand-in's first call
    assert hit["gen_ai.usage.cache_read.input_tokens"] == 30  # all of it, from the cache
    assert bad["http.response.status_code"] == 400
    assert all(secret_question not in str(s.to_json()) for s in spans)


def test_asking_for_tracing_without_the_extra_names_it(monkeypatch: pytest.MonkeyPatch) -> None:
    real = importlib.util.find_spec
    monkeypatch.setattr(
        tracing.importlib.util,
        "find_spec",
        lambda name, *a: None if name.startswith("opentelemetry") else real(name, *a),
    )
    with pytest.raises(ConfigError, match=r"infercache\[otel\]"):
        tracing.otlp_tracer()

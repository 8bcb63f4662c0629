"""OpenTelemetry, optional: one span per request, with the GenAI semantic conventions.

    span "chat MODEL" (or "text_completion MODEL", "embeddings MODEL"), kind SERVER
      gen_ai.operation.name                  chat | text_completion | embeddings
      gen_ai.request.model                   the model asked for
      gen_ai.usage.input_tokens              the answer's prompt tokens
      gen_ai.usage.output_tokens             its completion tokens
      gen_ai.usage.cache_read.input_tokens   prompt tokens served from a cache: all of them on
                                             an exact or semantic hit, the upstream's
                                             `cached_tokens` (its prefix cache) on a miss
      infercache.layer                       exact-hit | semantic-hit | miss | bypass | ...
      http.response.status_code              the status the client got
    The span holds no prompt or answer text, and no tenant.

On with `serve --otel`, or when `OTEL_EXPORTER_OTLP_ENDPOINT` is set: spans go to that OTLP/HTTP
endpoint (the standard OTEL_* variables configure the exporter). It needs the `otel` extra
(`pip install 'infercache[otel]'`); without it, asking for tracing is a ConfigError that says so.
Tests pass their own `TracerProvider` (with the SDK's in-memory exporter).
"""

from __future__ import annotations

import importlib.util
from collections.abc import Mapping
from typing import Any, Protocol

from infercache.errors import ConfigError
from infercache.policy import cached_tokens, usage_tokens

OPERATIONS = {"chat": "chat", "completions": "text_completion", "embeddings": "embeddings"}
_HIT_LAYERS = ("exact-hit", "semantic-hit")


class RequestSpan(Protocol):
    def end(self, *, status: int, layer: str | None, response: Mapping[str, Any] | None) -> None:
        """Close the span with what the request became (called once)."""
        ...


class RequestTracer(Protocol):
    def start(self, operation: str, model: object) -> RequestSpan: ...


class _NoSpan:
    def end(self, *, status: int, layer: str | None, response: Mapping[str, Any] | None) -> None:
        return None


class NoTracer:
    """Tracing off: spans cost nothing."""

    _span = _NoSpan()

    def start(self, operation: str, model: object) -> RequestSpan:
        return self._span


class _OTelSpan:
    def __init__(self, span: Any) -> None:
        self._span = span

    def end(self, *, status: int, layer: str | None, response: Mapping[str, Any] | None) -> None:
        span = self._span
        span.set_attribute("http.response.status_code", status)
        if layer is not None:
            span.set_attribute("infercache.layer", layer)
        if response is not None:
            prompt, completion = usage_tokens(response)
            span.set_attribute("gen_ai.usage.input_tokens", prompt)
            span.set_attribute("gen_ai.usage.output_tokens", completion)
            read = prompt if layer in _HIT_LAYERS else cached_tokens(response)
            span.set_attribute("gen_ai.usage.cache_read.input_tokens", read)
        if status >= 500:
            from opentelemetry.trace import Status, StatusCode

            span.set_status(Status(StatusCode.ERROR))
        span.end()


class OTelTracer:
    """Spans through an OpenTelemetry `TracerProvider` (the SDK's, or the global one)."""

    def __init__(self, provider: Any) -> None:
        from opentelemetry.trace import SpanKind

        self._tracer = provider.get_tracer("infercache.gateway")
        self._kind = SpanKind.SERVER

    def start(self, operation: str, model: object) -> RequestSpan:
        name = OPERATIONS.get(operation, operation)
        span = self._tracer.start_span(f"{name} {model}", kind=self._kind)
        span.set_attribute("gen_ai.operation.name", name)
        if isinstance(model, str):
            span.set_attribute("gen_ai.request.model", model)
        return _OTelSpan(span)


def otlp_tracer(service_name: str = "infercache-gateway") -> OTelTracer:
    """A tracer exporting to the OTLP/HTTP endpoint the standard OTEL_* variables name."""
    if importlib.util.find_spec("opentelemetry.sdk") is None or (
        importlib.util.find_spec("opentelemetry.exporter.otlp.proto.http") is None
    ):
        raise ConfigError(
            "OpenTelemetry tracing needs the otel extra: pip install 'infercache[otel]'"
        )
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    provider = TracerProvider(resource=Resource.create({"service.name": service_name}))
    provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
    return OTelTracer(provider)

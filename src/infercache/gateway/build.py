"""Assemble a gateway from settings: cache, upstreams (or the in-process engine), auth, app.

The embedded default (no upstream URL) loads the built-in engine in this process, sharing the
cache's `Metrics` so `/stats` shows the exact and prefix strategies side by side, and records
the engine's weights digest as the model's version before the first request.

The engine and the semantic layer are optional parts (extras.py): each is checked here, where it
is chosen, so a base install serving `--upstream` never imports torch, and one asked for the
engine or `--semantic` gets an error naming the extra to install.
"""

from __future__ import annotations

import functools
import logging
import os
from dataclasses import dataclass

from starlette.applications import Starlette

from infercache.cache import Cache
from infercache.clock import Clock, SystemClock
from infercache.engine.config import EngineConfig
from infercache.errors import ConfigError, InvalidRequestError, StoreError
from infercache.extras import require
from infercache.gateway.across_replicas import AcrossReplicas
from infercache.gateway.app import create_app
from infercache.gateway.auth import Auth
from infercache.gateway.config import GatewayConfig
from infercache.gateway.endpoints import ENDPOINTS, CachedEndpoint
from infercache.gateway.fingerprints import SwapWindow
from infercache.gateway.local_embeddings import MODEL_ID as MINILM_ID
from infercache.gateway.local_embeddings import LocalEmbeddings
from infercache.gateway.messages_endpoint import Breakpoints, messages_endpoint
from infercache.gateway.requestlog import RequestLog
from infercache.gateway.response_conversations import ResponseConversations
from infercache.gateway.responses_endpoint import responses_endpoint
from infercache.gateway.rollout import Rollout
from infercache.gateway.service import Gateway
from infercache.gateway.tracing import RequestTracer, otlp_tracer
from infercache.gateway.upstream import KEYED_KINDS, SALTED_KINDS, HTTPUpstream
from infercache.gateway.upstream_protocols import EmbeddingsUpstream, Upstream
from infercache.gateway.versions import ModelVersionTracker
from infercache.prompt_cache.breakpoints import BreakpointPolicy
from infercache.redaction import Redactor, load_or_create_secret
from infercache.request import Endpoint
from infercache.settings import Settings
from infercache.store_guard import GuardedBackend
from infercache.stores import Backend, open_store
from infercache.stores.memory import MemoryStore
from infercache.stores.redis_cluster import RedisClusterStore
from infercache.stores.redis_connect import is_redis_url
from infercache.stores.replica_flight import FlightTimings, open_flights
from infercache.stores.start_check import StoreAtStart, check_at_start

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Built:
    app: Starlette
    gateway: Gateway
    cache: Cache
    store: StoreAtStart | None = None  # what the start-up check found (stores/start_check.py)


def build(
    settings: Settings,
    config: GatewayConfig,
    *,
    engine_config: EngineConfig | None = None,
    clock: Clock | None = None,
    upstreams: list[Upstream] | None = None,
    tracer: RequestTracer | None = None,
) -> Built:
    """`upstreams` overrides both the URLs and the engine (tests pass their own)."""
    # Before anything starts: a missing part is an error naming its extra, not a traceback.
    if upstreams is None and not config.upstreams:
        require("engine", "the built-in engine (serve without --upstream)")
    if settings.semantic.enabled:
        require("semantic", "the semantic layer (--semantic)")
    clock = clock or SystemClock()
    cache, backend, store = _cache(settings, config, clock)
    engine_here = upstreams is None and not config.upstreams  # the built-in engine, in-process
    if upstreams is None:
        upstreams = _upstreams(settings, config, cache, engine_config)
    tracker = _tracker(config, cache, upstreams)
    request_log = (
        RequestLog(
            config.request_log,
            redactor=Redactor.of(settings) if config.redact else None,  # redaction.py
        )
        if config.request_log
        else None
    )
    conversations = ResponseConversations(cache.backend, clock, cache.policy)
    gateway = Gateway(
        cache,
        upstreams,
        tracker=tracker,
        request_log=request_log,
        across=_across_replicas(settings, config, clock, backend),
        embedder=_embedder(cache, upstreams),
        tracer=tracer or (otlp_tracer() if config.otel else None),
        endpoints=_endpoints(config, clock, conversations),
    )
    if settings.semantic.enabled:
        from infercache.gateway.semantic_setup import enable_from_settings

        enable_from_settings(
            cache,
            settings.semantic,
            judge_fetch=gateway.background_fetch("", None),
            # One torch thread for the embedder beside the engine: a second OpenMP team would
            # throttle the engine's decode by a third (semantic/embedder.py MiniLMEmbedder).
            torch_threads=1 if engine_here else None,
        )
    if config.rollout is not None:
        declare_at_start(gateway, Rollout.of(config.rollout))
    app = create_app(
        gateway,
        Auth(config.api_keys, config.admin_token, config.metrics_token),
        max_body_bytes=config.max_body_bytes,
        version_poll_s=config.version_poll_s,
        version_probe_s=config.version_probe_s,
        conversations=conversations,
    )
    return Built(app, gateway, cache, store)


def _cache(
    settings: Settings, config: GatewayConfig, clock: Clock
) -> tuple[Cache, Backend, StoreAtStart]:
    """The cache on its store, asked once at start (start_check.py) before the engine loads,
    each call within the store budget (store_guard.py) unless the store is in-process memory."""
    backend: Backend = open_store(
        settings.resolved_store_url,
        clock=clock,
        max_bytes=settings.max_store_bytes,
        timeout_s=config.store_budget_s,
    )
    store = check_at_start(backend, optional=config.store_optional)
    if not isinstance(backend, MemoryStore):  # in-process memory never stalls
        backend = GuardedBackend(backend, clock=clock, budget_s=config.store_budget_s)
    # Store I/O off the event loop on as many threads as cores: more only add GIL hand-offs
    # (measured: 2 workers served ~20% more hits/s than 8 on 2 cores); a stalled store holds
    # each for at most its budget.
    workers = min(8, os.cpu_count() or 2)
    cache = Cache(settings, clock=clock, backend=backend, store_workers=workers)
    return cache, backend, store


def _tracker(config: GatewayConfig, cache: Cache, upstreams: list[Upstream]) -> ModelVersionTracker:
    """The model versions the replicas serve; an HTTP replica's KV salt follows its own."""
    tracker = ModelVersionTracker(
        cache,
        [u.name for u in upstreams],
        use_fingerprints=config.use_fingerprints,
        window=SwapWindow(config.fingerprint_swap_s, config.fingerprint_swap_answers),
    )
    for i, upstream in enumerate(upstreams):
        if isinstance(upstream, HTTPUpstream):
            upstream.salt_version = functools.partial(tracker.replicas.reported, i)
    return tracker


def _endpoints(
    config: GatewayConfig, clock: Clock, conversations: ResponseConversations
) -> dict[Endpoint, CachedEndpoint]:
    """The cached endpoints: OpenAI's, and Anthropic's Messages and OpenAI's Responses with
    what they keep (the breakpoint policy and prefixes seen; the conversations served)."""
    by_tenant = config.anthropic_breakpoints_by_tenant
    breakpoints = Breakpoints(
        clock,
        BreakpointPolicy(config.anthropic_breakpoints),
        {tenant: BreakpointPolicy(policy) for tenant, policy in by_tenant.items()},
    )
    return {
        **ENDPOINTS,
        Endpoint.MESSAGES: messages_endpoint(breakpoints),
        Endpoint.RESPONSES: responses_endpoint(conversations),
    }


def declare_at_start(gateway: Gateway, rollout: Rollout) -> None:
    """`serve --canary`: the rollout declared before the first request (a 400's words, as a
    ConfigError, when it names upstreams this gateway does not have)."""
    try:
        gateway.rollout.declare(rollout)
    except InvalidRequestError as exc:
        raise ConfigError(f"--canary: {exc.message}") from None


def _embedder(cache: Cache, upstreams: list[Upstream]) -> EmbeddingsUpstream:
    """An HTTP upstream serves embeddings itself; the embedded default uses the packaged
    MiniLM in process (its version recorded like the engine's)."""
    for upstream in upstreams:
        if isinstance(upstream, HTTPUpstream):
            return upstream
    local = LocalEmbeddings()
    _record_version(cache, MINILM_ID, local.model_version())
    return local


def _record_version(cache: Cache, model: str, version: str) -> None:
    try:
        cache.set_model_version(model, version)
    except StoreError as exc:  # the store is down at start: caching waits for it
        log.warning("could not record version %s of %s: %s", version, model, exc)


def _across_replicas(
    settings: Settings, config: GatewayConfig, clock: Clock, backend: Backend
) -> AcrossReplicas | None:
    """Replica flights beside a Redis store, so gateways sharing it make one call per key."""
    url = settings.resolved_store_url
    if not (config.share_flights and is_redis_url(url)):
        return None
    timings = FlightTimings(
        lease_ms=int(config.replica_lease_s * 1000),
        answer_ttl_ms=5_000,
        # The store budget, but at least 250 ms: an asyncio deadline also counts the time the
        # call waits for the event loop, which a busy gateway makes long.
        call_ms=max(250, int(config.store_budget_s * 1000)),
    )
    guard = backend if isinstance(backend, GuardedBackend) else None
    inner = guard.inner if guard is not None else backend
    nodes = inner.connected_nodes if isinstance(inner, RedisClusterStore) else None
    return AcrossReplicas(
        open_flights(url, clock=clock, timings=timings, nodes=nodes),
        guard=guard,
        wait_s=config.upstream_timeout_s,
    )


def _upstreams(
    settings: Settings,
    config: GatewayConfig,
    cache: Cache,
    engine_config: EngineConfig | None,
) -> list[Upstream]:
    if config.upstreams:
        # vLLM and SGLang take a per-tenant cache_salt, OpenAI a derived prompt_cache_key
        salted = any(spec.kind in (*SALTED_KINDS, *KEYED_KINDS) for spec in config.upstreams)
        secret = config.salt_secret or (
            load_or_create_secret(settings.data_dir) if salted else None
        )
        return [
            HTTPUpstream(
                spec.url,
                api_key=config.key_for(spec),
                forward_client_key=config.forward_client_key,
                forward_headers=frozenset(config.forward_headers),
                kind=spec.kind,
                salt_secret=secret,
                timeout_s=config.upstream_timeout_s,
            )
            for spec in config.upstreams
        ]
    from infercache.engine.engine import Engine
    from infercache.gateway.engine_upstream import EngineUpstream

    engine = Engine(
        engine_config or EngineConfig(data_dir=settings.data_dir),
        metrics=cache.metrics,
        clock=cache.clock,
    )
    _record_version(cache, engine.model_id, engine.model_version)
    return [EngineUpstream(engine)]

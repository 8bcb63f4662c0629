"""`infercache serve`: the OpenAI-compatible caching gateway (the README's main job).

`--semantic[=MODE]` turns the semantic layer on. MODE `auto` (the flag alone) keeps the mode of
`--config`'s `[semantic]` table, whose own default is: calibrated when it holds a threshold
(`infercache tune --write-config`), else shadow — so with no calibration the layer starts in
shadow and serves nothing until judged live traffic certifies its false-hit bound
(semantic/shadow.py). `shadow` or `calibrated` forces that mode.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

from infercache.cli_cache import add_store_options, settings_from_args
from infercache.engine.cli import TIER_OPTIONS, add_tier_options, add_weights_option
from infercache.errors import ConfigError, InfercacheError
from infercache.gateway.config import (
    GatewayConfig,
    UpstreamSpec,
    parse_api_keys,
    parse_breakpoints,
)
from infercache.gateway.rollout_options import add_rollout_options, rollout_flags
from infercache.listen import bind_listener
from infercache.settings import Settings
from infercache.urls import mask_credentials


def _config(args: argparse.Namespace) -> GatewayConfig:
    config = GatewayConfig()
    if args.config is not None:
        config = config.with_toml(args.config)
    flags: dict[str, Any] = {}
    if args.host is not None:
        flags["host"] = args.host
    if args.port is not None:
        flags["port"] = args.port
    if args.upstream:
        specs = [UpstreamSpec.parse(u) for u in args.upstream]
        if args.upstream_key_env is not None:
            specs = [s if s.key_env else replace(s, key_env=args.upstream_key_env) for s in specs]
        flags["upstreams"] = specs
    elif args.upstream_key_env is not None:
        raise ConfigError("--upstream-key-env needs --upstream")
    if args.forward_client_key:
        flags["forward_client_key"] = True
    if args.forward_header:
        flags["forward_headers"] = tuple(args.forward_header)
    if args.otel:
        flags["otel"] = True
    if args.api_key:
        flags["api_keys"] = parse_api_keys(args.api_key)
    if args.admin_token is not None:
        flags["admin_token"] = args.admin_token
    if args.metrics_token is not None:
        flags["metrics_token"] = args.metrics_token
    if args.request_log is not None:
        flags["request_log"] = args.request_log
    if args.redact:
        flags["redact"] = True
    if args.max_body_bytes is not None:
        flags["max_body_bytes"] = args.max_body_bytes
    if args.store_optional:
        flags["store_optional"] = True
    if args.anthropic_breakpoints:
        flags.update(parse_breakpoints(args.anthropic_breakpoints))
    if args.canary:
        flags["rollout"] = rollout_flags(args)
    return config.with_values(flags, source="command line").with_env(os.environ)


def serve_settings(args: argparse.Namespace) -> Settings:
    """The cache settings `serve` runs with: `--config`, the environment, then the flags."""
    settings = settings_from_args(args)
    if args.semantic is not None:
        values: dict[str, Any] = {"enabled": True}
        if args.semantic != "auto":
            values["mode"] = args.semantic
        settings = replace(settings, semantic=settings.semantic_with(values, "--semantic"))
    return settings


def _serve(args: argparse.Namespace) -> int:
    from infercache.engine.config import EngineConfig
    from infercache.gateway.build import build
    from infercache.gateway.http_server import make_config
    from infercache.server_exit import DrainingServer, exit_on_signals

    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    try:
        settings = serve_settings(args)
        config = _config(args)
        engine_config = EngineConfig(
            data_dir=settings.data_dir,
            model_path=args.model,
            prefix_cache=not args.no_prefix_cache,
            **{
                name: getattr(args, name)
                for name in ("max_kv_bytes", "max_batch", "max_queue", "weights", *TIER_OPTIONS)
                if getattr(args, name) is not None
            },
        )
        exit_on_signals()  # Ctrl-C while the model loads: an ordinary exit, no traceback
        listener = bind_listener(config.host, config.port)  # a port in use: before any load
        try:
            built = build(settings, config, engine_config=engine_config)
        except BaseException:
            listener.close()
            raise
    except (ConfigError, InfercacheError) as exc:
        print(f"infercache serve: {exc}", file=sys.stderr)
        return 2
    upstream = ", ".join(u.name for u in built.gateway.upstreams)
    semantic = built.cache.semantic
    mode = "off" if semantic is None else semantic.state()["mode"]
    store = (
        built.store.describe()
        if built.store is not None
        else mask_credentials(built.cache.backend.url)
    )
    if semantic is not None:
        on = settings.semantic.calibrated_on or "nothing recorded (no `tune` line in the config)"
        print(f"infercache serve: semantic {mode}, calibrated on: {on}", flush=True)
    ready_line = (
        f"infercache gateway ready on http://{config.host}:{config.port}/v1 "
        f"(upstream: {upstream}; store: {store}; semantic: {mode}"
        f"{_engine_weights(built.gateway.upstreams) if not config.upstreams else ''})"
    )

    class Server(DrainingServer):
        async def startup(self, sockets: list[Any] | None = None) -> None:
            await super().startup(sockets=sockets)
            if self.started:  # listening: say so only now, so scripts can wait on this line
                print(ready_line, flush=True)

    uvicorn_config = make_config(built.app, host=config.host, port=config.port)
    Server(uvicorn_config).run(sockets=[listener])
    return 0


def _engine_weights(upstreams: Any) -> str:
    """`; weights: fp16 (fp_…-fp16)` for a built-in engine upstream: its weight format and the
    model version its answers are cached under. Asked only when the engine runs here (its
    module imports torch, which an install without the engine extra does not have)."""
    from infercache.gateway.engine_upstream import EngineUpstream

    engines = [u.engine for u in upstreams if isinstance(u, EngineUpstream)]
    return "".join(f"; weights: {e.weights} ({e.model_version})" for e in engines)


def register(sub: argparse._SubParsersAction[Any]) -> None:
    p = sub.add_parser(
        "serve",
        help="run the OpenAI-compatible caching gateway",
        description="Serve /v1/chat/completions through the cache. With no --upstream, the "
        "built-in engine runs in this process (the embedded default).",
    )
    add_store_options(p)
    _upstream_options(p)
    add_rollout_options(p)
    _access_options(p)
    _engine_options(p)
    p.set_defaults(handler=_serve)


def _upstream_options(p: argparse.ArgumentParser) -> None:
    """Where the gateway listens, what it calls on a miss, and whether it starts without its
    store."""
    p.add_argument(
        "--store-optional",
        action="store_true",
        help="start even when the store does not answer: degraded, caching nothing until it "
        "does (the ready line and /healthz say so); default: refuse to start, naming the cause",
    )
    p.add_argument("--host", help="interface to listen on (default 127.0.0.1)")
    p.add_argument("--port", type=int, help="TCP port to listen on (default 8080)")
    p.add_argument(
        "--upstream",
        action="append",
        metavar="URL[,kind=K][,key_env=VAR]",
        help="an OpenAI-compatible base URL (repeat for replicas; prefix-aware routing); kind is "
        "openai (default), vllm, sglang or anthropic (api.anthropic.com: /v1/messages); key_env "
        "names the variable holding its API key",
    )
    p.add_argument(
        "--anthropic-breakpoints",
        action="append",
        metavar="[TENANT=]POLICY",
        help="an Anthropic upstream's cache_control breakpoints: inject (mark a prefix only "
        "once seen before, so none asked once pays the write premium), pass (the client's) or "
        "strip; TENANT=POLICY for one tenant (repeatable; default inject)",
    )
    p.add_argument(
        "--upstream-key-env",
        metavar="VAR",
        help="environment variable holding the API key of every --upstream without key_env "
        "(default: INFERCACHE_UPSTREAM_API_KEY); a client's gateway key is never forwarded",
    )
    p.add_argument(
        "--forward-client-key",
        action="store_true",
        help="open mode only: send each caller's own bearer token to the upstream",
    )
    p.add_argument(
        "--forward-header",
        action="append",
        metavar="NAME",
        help="a client header that passed-through requests carry upstream, beyond the allowed "
        "content, version and SDK headers (repeatable; never a credential header; default none)",
    )
    p.add_argument(
        "--max-body-bytes", type=int, help="reject larger bodies with 413 (default 4194304)"
    )


def _access_options(p: argparse.ArgumentParser) -> None:
    """Who may call the gateway, and what it records of the calls."""
    p.add_argument(
        "--api-key",
        action="append",
        metavar="KEY=TENANT",
        help="a client API key and its tenant (repeatable); with any, keys are required "
        "(default: none: open mode, each caller's bearer token hashed into its tenant)",
    )
    p.add_argument(
        "--admin-token",
        help="bearer token for /admin/* and, with --api-key, /stats (or INFERCACHE_ADMIN_TOKEN; "
        "default: none, /admin/* refused)",
    )
    p.add_argument(
        "--metrics-token",
        help="bearer token for /metrics (or INFERCACHE_METRICS_TOKEN; default: open without "
        "--api-key, the admin token with it)",
    )
    p.add_argument(
        "--request-log",
        type=Path,
        metavar="PATH",
        help="append one JSON line per request, for `infercache analyze` (default: no log)",
    )
    p.add_argument(
        "--redact",
        action="store_true",
        help="log no request text: keyed digests and prefix hashes that analyze reads",
    )
    p.add_argument(
        "--otel",
        action="store_true",
        help="a span per request, exported over OTLP/HTTP (the OTEL_* variables configure it; "
        "on by itself when OTEL_EXPORTER_OTLP_ENDPOINT is set; needs infercache[otel])",
    )


def _engine_options(p: argparse.ArgumentParser) -> None:
    """The semantic layer, and the built-in engine (serving without --upstream)."""
    p.add_argument(
        "--semantic",
        nargs="?",
        const="auto",
        choices=("auto", "shadow", "calibrated"),
        metavar="MODE",
        help="enable the semantic layer (off by default); MODE: auto (the flag alone: "
        "calibrated with the threshold `infercache tune --write-config` put in --config, "
        "shadow without one), shadow (serve nothing until judged live traffic meets the "
        "false-hit bound) or calibrated",
    )
    p.add_argument(
        "--model",
        type=Path,
        help="built-in engine: a Llama-family checkpoint, an HF safetensors folder or a .gguf "
        "file (default: the packaged SmolLM2-135M-Instruct)",
    )
    p.add_argument(
        "--max-kv-bytes",
        type=int,
        help="built-in engine: KV prefix cache budget in bytes (default 536870912, 512 MiB)",
    )
    p.add_argument(
        "--no-prefix-cache", action="store_true", help="built-in engine: disable KV reuse"
    )
    add_tier_options(p)
    p.add_argument(
        "--max-batch",
        type=int,
        help="built-in engine: requests decoded together, one batched forward a step (default 16)",
    )
    p.add_argument(
        "--max-queue",
        type=int,
        help="built-in engine: requests that may wait for a place; one more is a 429 with "
        "Retry-After, passed to the client and never stored (default 64)",
    )
    add_weights_option(p, prefix="built-in engine: ")

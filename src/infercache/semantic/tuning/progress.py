"""The progress `tune` shows while it embeds and fits: a rich bar on stderr, one task per stage
(embed, adapter), drawn only when stderr is a terminal; and `Reporting`, an embedder wrapper
that embeds in batches and reports each one."""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence
from typing import Any

from infercache.semantic.embedder import Embedder, EmbedderWrapper


def progress_bar() -> ProgressBar:
    """On stderr when it is a terminal (a log or a pipe gets no bar; stdout is the report)."""
    return ProgressBar(enabled=sys.stderr.isatty())


class Reporting(EmbedderWrapper):
    """An embedder that embeds in batches and reports each one (`embed` stage)."""

    def __init__(self, inner: Embedder, progress: Callable[[str, int, int], None]) -> None:
        super().__init__(inner)
        self._progress = progress

    def embed(self, texts: Sequence[str]) -> Any:
        from infercache.semantic.tuning.fit import embed_all

        return embed_all(self.inner, texts, self._progress)


class ProgressBar:
    """A rich progress bar on stderr, one task per stage (embed, adapter)."""

    def __init__(self, *, enabled: bool) -> None:
        self._enabled = enabled
        self._progress: Any = None
        self._tasks: dict[str, Any] = {}

    def __enter__(self) -> ProgressBar:
        if self._enabled:
            from rich.console import Console
            from rich.progress import Progress

            self._progress = Progress(console=Console(stderr=True), transient=False)
            self._progress.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._progress is not None:
            self._progress.stop()

    def update(self, stage: str, done: int, total: int) -> None:
        if self._progress is None:
            return
        if stage not in self._tasks:
            label = {"embed": "embedding texts", "adapter": "training the adapter"}
            self._tasks[stage] = self._progress.add_task(label.get(stage, stage), total=total)
        self._progress.update(self._tasks[stage], completed=done, total=total)  # a stage reruns

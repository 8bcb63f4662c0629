"""Progress bars only on a terminal.

transformers and huggingface_hub draw tqdm bars while they load or convert a model ("Loading
weights", "Converting and de-quantizing GGUF tensors", "Writing model shards"). On a terminal a
bar redraws one line; written to a log file (`serve 2> gateway.log`, a service manager) every
redraw is a `\\r`-joined fragment of one long line. `quiet_off_terminal(stream, environ)`, called
once when the command line starts, before any of them is imported, turns those bars off when
`stream` (stderr) is not a terminal, through the variables both libraries read at import:
`HF_HUB_DISABLE_PROGRESS_BARS` (huggingface_hub, and transformers, which follows it) and
`TQDM_DISABLE` (tqdm itself, for any other library's bar). A value the user set is kept.
infercache's own bars (`tune`, `analyze --progress`) ask the terminal themselves.
"""

from __future__ import annotations

from collections.abc import MutableMapping
from typing import TextIO

OFF = {"HF_HUB_DISABLE_PROGRESS_BARS": "1", "TQDM_DISABLE": "1"}


def quiet_off_terminal(stream: TextIO, environ: MutableMapping[str, str]) -> bool:
    """Turn third-party progress bars off unless `stream` is a terminal; whether it did."""
    try:
        terminal = stream.isatty()
    except (AttributeError, ValueError):  # a closed or replaced stream
        terminal = False
    if terminal:
        return False
    for name, value in OFF.items():
        environ.setdefault(name, value)
    return True

"""The packaged out-of-domain set (issue 23, item 1): a few thousand short questions and requests
across many topics that no support or assistant deployment should answer from another question's
cached answer, so every calibration can measure what unrelated text reaches.

`semantic/data/ood_questions.csv` (`text,source`, one short line each): WebQuestions' training
questions (CC BY 4.0) and general-chat requests from the arena-hard v2.0 prompts and a ShareGPT
sample (Apache-2.0); sources, licences, counts and how it is rebuilt in `semantic/data/README.md`
(bench/build_semantic_data.py). It holds nothing from banking77 or hwu64, and none of the
held-out texts the tests serve (tests/semantic/data/ood_heldout.csv).
"""

from __future__ import annotations

import csv
import io
from importlib import resources

OOD_FILE = "ood_questions.csv"


def read_ood_set() -> list[tuple[str, str]]:
    """(text, source) for every packaged out-of-domain text, in file order."""
    data = resources.files("infercache.semantic").joinpath("data", OOD_FILE)
    reader = csv.DictReader(io.StringIO(data.read_text(encoding="utf-8")))
    return [(row["text"], row["source"]) for row in reader]


def ood_texts() -> list[str]:
    return [text for text, _ in read_ood_set()]

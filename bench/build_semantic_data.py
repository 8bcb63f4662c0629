"""Rebuild the semantic layer's shipped data from its public sources (issue 23, items 1 and 6).

    .venv/bin/python bench/build_semantic_data.py --shared /work/shared/data \\
        --nlu NLU-Evaluation-Data/CrossValidation \\
        --webquestions dataset-factoid-webquestions/main \\
        --self-instruct self-instruct/data/seed_tasks.jsonl

Writes (same inputs, same bytes: no randomness, gzip without a timestamp):

- `tests/semantic/data/banking77.csv.gz` (`text,label`): every distinct banking77 training text
  with its intent; a text filed under two intents is dropped.
- `tests/semantic/data/hwu64.csv.gz` (`text,intent,label`): the hwu64 texts with an answer
  label that is stricter than the intent. The NLU-Evaluation-Data annotations (the
  cross-validation test folds, which together cover every hwu64 text) give each text's slots:
  `label` is the intent plus its normalised slot values (`weather_query[date=tomorrow;
  place_name=london]`), because "weather in London" and "weather in Paris" do not share an
  answer; a few synonymous slot values are merged (`SLOT_SYNONYMS`). Intents whose answer
  depends on words the annotation leaves out (`UNIQUE_ANSWER`: sums, facts, definitions, stock
  and currency questions, quirky chat) label every text on its own; intents that only mean
  something inside a conversation (`IN_CONVERSATION`: yes, no, stop, repeat, ...) are left out.
- `src/infercache/semantic/data/ood_questions.csv` (`text,source`): the packaged out-of-domain
  set — WebQuestions' training questions (short factual questions on Freebase topics) and
  three quarters of the general-chat requests (first lines of the arena-hard prompts and first
  human turns of the ShareGPT sample that pass `chat_line`), chosen by a hash of the text.
- `tests/semantic/data/ood_heldout.csv` (`text,source`): never packaged, for tests and the
  days — WebQuestions' test questions, the other quarter of the chat requests, and the
  self-instruct seed instructions that need no input.
Both OOD files hold short single-line texts only (`MAX_CHARS`), deduplicated case-insensitively
across both files (a text in both would make the held-out set a test of memory), and nothing
from banking77 or hwu64.
"""

from __future__ import annotations

import argparse
import csv
import gzip
import hashlib
import io
import json
import re
import sys
from collections import defaultdict
from collections.abc import Iterable, Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TEST_DATA = ROOT / "tests" / "semantic" / "data"
PACKAGE_DATA = ROOT / "src" / "infercache" / "semantic" / "data"
MAX_CHARS = 200
UNIQUE_ANSWER = frozenset(
    {"qa_maths", "qa_factoid", "qa_definition", "qa_stock", "qa_currency", "general_quirky"}
)
IN_CONVERSATION = frozenset(
    {
        "general_affirm", "general_negate", "general_confirm", "general_dontcare",
        "general_repeat", "general_commandstop", "general_explain",
    }
)  # fmt: skip
SLOT_SYNONYMS = {
    "vacuum cleaner": "vacuum", "robot vacuum cleaner": "vacuum", "robot vacuum": "vacuum",
    "hoover": "vacuum", "vaccum": "vacuum", "vacuum robot": "vacuum",
}  # fmt: skip
HELD_OUT_CHAT_PERCENT = 25
CODE_MARKS = re.compile(r"[{}<>`\\|]|;\s*$|^\s*(import|def|class|from|#|//|select)\b", re.I)


def stable_percent(text: str) -> int:
    return int(hashlib.sha256(text.encode("utf-8")).hexdigest()[:8], 16) % 100


def read_banking77(path: Path) -> list[tuple[str, str]]:
    labels: dict[str, set[str]] = defaultdict(set)
    order: list[str] = []
    with path.open(encoding="utf-8", newline="") as handle:
        for row in csv.DictReader(handle):
            text = row["text"].strip()
            if text not in labels:
                order.append(text)
            labels[text].add(row["category"].strip())
    return [(t, next(iter(labels[t]))) for t in order if len(labels[t]) == 1]


def read_annotations(root: Path) -> dict[str, list[tuple[str, str]]]:
    """Lower-cased text → sorted (slot, value) pairs, from every annotated test fold."""
    slots: dict[str, list[tuple[str, str]]] = {}
    for path in sorted(root.rglob("*.json")):
        if "testset" not in path.parts or "annotated" not in path.parts:
            continue
        for row in json.loads(path.read_text(encoding="utf-8"))["test_data_annotation"]:
            pairs = sorted(
                (e["entity"], normalised_slot(e["value"])) for e in row.get("entities", [])
            )
            slots[row["text"].strip().lower()] = pairs
    return slots


def normalised_slot(value: str) -> str:
    value = " ".join(value.lower().split())
    return SLOT_SYNONYMS.get(value, value)


def hwu64_label(text: str, intent: str, slots: list[tuple[str, str]]) -> str:
    if intent in UNIQUE_ANSWER:
        return f"{intent}#{hashlib.sha256(text.lower().encode()).hexdigest()[:10]}"
    if not slots:
        return intent
    return intent + "[" + ";".join(f"{name}={value}" for name, value in slots) + "]"


def read_hwu64(path: Path, slots: dict[str, list[tuple[str, str]]]) -> list[tuple[str, str, str]]:
    rows: list[tuple[str, str, str]] = []
    seen: set[str] = set()
    with path.open(encoding="utf-8", newline="") as handle:
        reader = csv.reader(handle, delimiter="\t", quoting=csv.QUOTE_NONE)
        next(reader)
        for _split, raw, intent in reader:
            text = raw.strip()
            if intent in IN_CONVERSATION or text.lower() in seen:
                continue
            seen.add(text.lower())
            if text.lower() not in slots:
                raise ValueError(f"no annotation for hwu64 text {text!r}")
            rows.append((text, intent, hwu64_label(text, intent, slots[text.lower()])))
    return rows


def short_line(text: str) -> str | None:
    text = " ".join(text.split())
    if not 8 <= len(text) <= MAX_CHARS:
        return None
    letters = [c for c in text if c.isalpha()]
    if not letters or sum(c.isascii() for c in letters) < 0.95 * len(letters):
        return None
    return text


def chat_line(text: str) -> str | None:
    """A general-chat request fit for the OOD set: one short English line that is not code."""
    first = text.strip().split("\n", 1)[0]
    line = short_line(first)
    if line is None or CODE_MARKS.search(line) or len(line.split()) < 3 or line[-1] in ":,":
        return None  # code, or the opening of something pasted below it
    return line


def read_webquestions(directory: Path, splits: Sequence[str]) -> list[str]:
    out: list[str] = []
    for split in splits:
        for row in json.loads((directory / f"{split}.json").read_text(encoding="utf-8")):
            line = short_line(row["qText"])
            if line is not None:
                out.append(line)
    return out


def read_chat(shared: Path) -> list[tuple[str, str]]:
    out: list[tuple[str, str]] = []
    with (shared / "arena_hard_v2.0_questions.jsonl").open(encoding="utf-8") as handle:
        for raw in handle:
            line = chat_line(json.loads(raw)["prompt"])
            if line is not None:
                out.append((line, "arena-hard"))
    with (shared / "sharegpt_multiturn_sample.jsonl").open(encoding="utf-8") as handle:
        for raw in handle:
            turns = json.loads(raw)["conversations"]
            if turns and turns[0]["from"] == "human":
                line = chat_line(turns[0]["value"])
                if line is not None:
                    out.append((line, "sharegpt"))
    return out


def read_self_instruct(path: Path) -> list[str]:
    out: list[str] = []
    with path.open(encoding="utf-8") as handle:
        for raw in handle:
            task = json.loads(raw)
            if all(not instance["input"].strip() for instance in task["instances"]):
                line = short_line(task["instruction"])
                if line is not None:
                    out.append(line)
    return out


def deduplicated(rows: Iterable[tuple[str, str]], taken: set[str]) -> list[tuple[str, str]]:
    out: list[tuple[str, str]] = []
    for text, source in rows:
        key = text.lower().rstrip("?.! ")
        if key not in taken:
            taken.add(key)
            out.append((text, source))
    return out


def csv_bytes(header: Sequence[str], rows: Iterable[Sequence[str]]) -> bytes:
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(header)
    writer.writerows(rows)
    return buffer.getvalue().encode("utf-8")


def write_gzip(path: Path, data: bytes) -> None:
    with path.open("wb") as raw, gzip.GzipFile(fileobj=raw, mode="wb", mtime=0) as handle:
        handle.write(data)


def build(args: argparse.Namespace) -> dict[str, int]:
    banking = read_banking77(args.shared / "banking77_train.csv")
    hwu = read_hwu64(args.shared / "hwu64_intents.tsv", read_annotations(args.nlu))
    in_domain = {t.lower().rstrip("?.! ") for t, _ in banking} | {
        t.lower().rstrip("?.! ") for t, _, _ in hwu
    }
    chat = read_chat(args.shared)
    taken = set(in_domain)
    packaged = deduplicated(
        [(t, "webquestions") for t in read_webquestions(args.webquestions, TRAIN_SPLITS)]
        + [(t, s) for t, s in chat if stable_percent(t) >= HELD_OUT_CHAT_PERCENT],
        taken,
    )
    held_out = deduplicated(
        [(t, "webquestions") for t in read_webquestions(args.webquestions, ("test",))]
        + [(t, s) for t, s in chat if stable_percent(t) < HELD_OUT_CHAT_PERCENT]
        + [(t, "self-instruct") for t in read_self_instruct(args.self_instruct)],
        taken,
    )
    TEST_DATA.mkdir(parents=True, exist_ok=True)
    PACKAGE_DATA.mkdir(parents=True, exist_ok=True)
    write_gzip(TEST_DATA / "banking77.csv.gz", csv_bytes(("text", "label"), banking))
    write_gzip(TEST_DATA / "hwu64.csv.gz", csv_bytes(("text", "intent", "label"), hwu))
    (PACKAGE_DATA / "ood_questions.csv").write_bytes(csv_bytes(("text", "source"), packaged))
    (TEST_DATA / "ood_heldout.csv").write_bytes(csv_bytes(("text", "source"), held_out))
    counts = {"banking77": len(banking), "hwu64": len(hwu)}
    for name, rows in (("ood_questions", packaged), ("ood_heldout", held_out)):
        for source in sorted({s for _, s in rows}):
            counts[f"{name}:{source}"] = sum(s == source for _, s in rows)
    return counts


TRAIN_SPLITS = ("trainmodel", "val", "devtest")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shared", type=Path, default=Path("/work/shared/data"))
    parser.add_argument("--nlu", type=Path, required=True, help="NLU-Evaluation-Data folds")
    parser.add_argument("--webquestions", type=Path, required=True, help="its main/ folder")
    parser.add_argument("--self-instruct", type=Path, required=True, help="seed_tasks.jsonl")
    counts = build(parser.parse_args(argv))
    print(json.dumps(counts, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())

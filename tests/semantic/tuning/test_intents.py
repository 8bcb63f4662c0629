"""Intent-labelled texts: the formats `tune` reads, telling them from pairs, and the split."""

from __future__ import annotations

from pathlib import Path

import pytest

from infercache.errors import InvalidRequestError
from infercache.semantic.tuning.intents import (
    LabelledText,
    file_kind,
    read_labelled,
    split_labelled,
)


def write(path: Path, text: str) -> Path:
    path.write_text(text, encoding="utf-8")
    return path


def test_csv_tsv_and_jsonl_give_the_same_texts_and_a_repeat_keeps_its_first_label(
    tmp_path: Path,
) -> None:
    csv_file = write(tmp_path / "a.csv", 'text,category\n"Hi, card?",card\nWhere?,post\nWhere?,x\n')
    tsv_file = write(
        tmp_path / "a.tsv", "split\ttext\tintent\nt\tHi, card?\tcard\nt\tWhere?\tpost\n"
    )
    jsonl = write(
        tmp_path / "a.jsonl",
        '{"text": "Hi, card?", "label": "card"}\n\n{"text": "Where?", "label": "post"}\n',
    )
    expected = [LabelledText("Hi, card?", "card"), LabelledText("Where?", "post")]
    assert read_labelled(csv_file) == read_labelled(tsv_file) == read_labelled(jsonl) == expected
    assert {file_kind(p) for p in (csv_file, tsv_file, jsonl)} == {"labelled"}
    assert file_kind(write(tmp_path / "p.tsv", "a\tb\tsame\nx\ty\t1\n")) == "pairs"


@pytest.mark.parametrize(
    ("name", "content", "message"),
    [
        ("h.csv", "words,label\nx,y\n", "neither a pairs file"),
        ("one.csv", "text,label\nx,a\ny,a\n", "at least two labels"),
        ("bad.jsonl", '{"text": "x", "label": "a"}\n{"text": 3}\n', "bad.jsonl:2"),
        ("empty.csv", "", "empty"),
    ],
)
def test_bad_files_are_refused_naming_the_file(
    tmp_path: Path, name: str, content: str, message: str
) -> None:
    path = write(tmp_path / name, content)
    with pytest.raises(InvalidRequestError, match=message):
        read_labelled(path) if file_kind(path) == "labelled" else None


def test_the_split_is_disjoint_stratified_and_independent_of_order() -> None:
    rows = [LabelledText(f"{label} question {i}", label) for label in "abc" for i in range(20)]
    parts = split_labelled(rows, (0.5, 0.2, 0.3))
    assert [len(p) for p in parts] == [30, 12, 18]
    assert sorted(r.text for p in parts for r in p) == sorted(r.text for r in rows)
    assert all(sum(r.label == "a" for r in p) == len(p) // 3 for p in parts)
    reversed_parts = split_labelled(list(reversed(rows)), (0.5, 0.2, 0.3))
    assert [set(p) for p in reversed_parts] == [set(p) for p in parts]
    assert [set(p) for p in split_labelled(rows, (0.5, 0.2, 0.3), salt="x")] != [
        set(p) for p in parts
    ]
    with pytest.raises(ValueError, match="sum to 1"):
        split_labelled(rows, (0.5, 0.2))

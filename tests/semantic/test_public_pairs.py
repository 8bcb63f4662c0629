"""The bench's adapters from public data sets' native files (bench/semantic_public_pairs.py),
on small generated files."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from bench.semantic_public_pairs import (
    intent_pairs,
    read_banking77,
    read_gptcache_pairs,
    read_hwu64,
    read_mrpc,
    read_stsb,
)
from infercache.semantic.tuning.pairs import Pair


def write(path: Path, text: str) -> Path:
    path.write_text(text, encoding="utf-8")
    return path


STSB_HEADER = "split\tgenre\tfilename\tyear\tid\tscore\tsentence1\tsentence2\t(extra)\n"


def test_stsb_keeps_clear_scores_and_reads_quotes_literally(tmp_path: Path) -> None:
    path = write(
        tmp_path / "stsb.tsv",
        STSB_HEADER + 'train\tg\tf\t2012\t1\t5.0\tA "quoted\tB\n'
        "train\tg\tf\t2012\t2\t3.0\tmiddle\tignored\n"
        "dev\tg\tf\t2012\t3\t1.2\tC\tD\tsource\tsource\n"
        "train\tg\tf\t2012\t4\t4\tE\tF\n",
    )
    assert read_stsb(path) == [
        Pair('A "quoted', "B", True),
        Pair("C", "D", False),
        Pair("E", "F", True),
    ]
    assert read_stsb(path, splits={"dev"}) == [Pair("C", "D", False)]
    bad = write(tmp_path / "bad.tsv", STSB_HEADER + "train\tg\tf\t2012\t1\tfive\tA\tB\n")
    with pytest.raises(ValueError, match=r"bad.tsv:2: score 'five'"):
        read_stsb(bad)


def test_mrpc_quality_one_is_same(tmp_path: Path) -> None:
    path = write(
        tmp_path / "mrpc.tsv",
        "split\tQuality\t#1 ID\t#2 ID\t#1 String\t#2 String\n"
        'train\t1\t1\t2\tA said "x"\tB\ntest\t0\t3\t4\tC\tD\n',
    )
    assert read_mrpc(path) == [Pair('A said "x"', "B", True), Pair("C", "D", False)]
    assert read_mrpc(path, splits={"test"}) == [Pair("C", "D", False)]


def test_intent_sets_and_gptcache_pairs_are_read(tmp_path: Path) -> None:
    banking = write(tmp_path / "b.csv", 'text,category\n"Hi, card?",card\nWhere?,card\n')
    assert read_banking77(banking) == [("Hi, card?", "card"), ("Where?", "card")]
    hwu = write(tmp_path / "h.tsv", 'split\ttext\tintent\ntrain\twake "me"\talarm\ntest\tx\ty\n')
    assert read_hwu64(hwu, splits={"train"}) == [('wake "me"', "alarm")]
    gpt = write(tmp_path / "g.json", json.dumps([{"origin": "a", "similar": "b"}]))
    assert read_gptcache_pairs(gpt) == [Pair("a", "b", True)]
    with pytest.raises(ValueError, match="item 0"):
        read_gptcache_pairs(write(tmp_path / "g2.json", '[{"origin": 1}]'))


def test_intent_pairs_are_seeded_distinct_and_labelled_by_intent() -> None:
    rows = [(f"{intent} question {i}", intent) for intent in "abcde" for i in range(20)]
    intent_of = dict(rows)
    pairs = intent_pairs(rows, random.Random(7), count=200, positive_share=0.25)
    assert pairs == intent_pairs(rows, random.Random(7), count=200, positive_share=0.25)
    assert pairs != intent_pairs(rows, random.Random(8), count=200, positive_share=0.25)
    assert len(pairs) == 200
    assert sum(p.same for p in pairs) == 50
    assert all((intent_of[p.a] == intent_of[p.b]) == p.same and p.a != p.b for p in pairs)
    assert len({frozenset((p.a, p.b)) for p in pairs}) == 200


def test_intent_pairs_need_two_intents() -> None:
    with pytest.raises(ValueError, match="2\\+ intents"):
        intent_pairs([("a", "x"), ("b", "x")], random.Random(0), count=5)

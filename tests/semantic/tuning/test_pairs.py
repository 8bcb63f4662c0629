"""Reading labelled pairs: the `tune` formats (on small files written here; tests never read
/work/shared)."""

from __future__ import annotations

from pathlib import Path

import pytest

from infercache.errors import InvalidRequestError
from infercache.semantic.tuning.pairs import Pair, read_many, read_pairs


def write(path: Path, text: str) -> Path:
    path.write_text(text, encoding="utf-8")
    return path


def test_tsv_csv_and_jsonl_give_the_same_pairs(tmp_path: Path) -> None:
    tsv = write(tmp_path / "p.tsv", "same\ta\tb\textra\n1\tx y\tx, y\t-\nno\tp\tq\t-\n")
    csv_ = write(tmp_path / "p.csv", 'a,b,same\nx y,"x, y",TRUE\np,q,0\n')
    jsonl = write(
        tmp_path / "p.jsonl",
        '{"a": "x y", "b": "x, y", "same": true}\n\n{"a": "p", "b": "q", "same": "no"}\n',
    )
    expected = [Pair("x y", "x, y", True), Pair("p", "q", False)]
    assert read_pairs(tsv) == read_pairs(csv_) == read_pairs(jsonl) == expected
    assert read_many([tsv, jsonl]) == expected * 2


@pytest.mark.parametrize(
    ("value", "same"),
    [("1", True), ("0", False), ("true", True), ("False", False), ("YES", True), (" no ", False)],
)
def test_every_documented_same_form_is_accepted(tmp_path: Path, value: str, same: bool) -> None:
    assert read_pairs(write(tmp_path / "p.tsv", f"a\tb\tsame\nx\ty\t{value}\n"))[0].same is same


def test_json_numbers_and_booleans_are_same_values(tmp_path: Path) -> None:
    path = write(tmp_path / "p.jsonl", '{"a":"x","b":"y","same":1}\n{"a":"x","b":"y","same":0}\n')
    assert [p.same for p in read_pairs(path)] == [True, False]


def test_quoted_fields_may_hold_tabs_and_newlines_and_a_bom_is_ignored(tmp_path: Path) -> None:
    path = write(tmp_path / "p.tsv", '\ufeffa\tb\tsame\n"one\ttab"\t"two\nlines"\tyes\n')
    assert read_pairs(path) == [Pair("one\ttab", "two\nlines", True)]


@pytest.mark.parametrize(
    ("name", "content", "message"),
    [
        ("p.tsv", "a\tb\tsame\nx\ty\tmaybe\n", r"p.tsv:2: 'same' must be one of .* got 'maybe'"),
        ("p.tsv", "a\tb\nx\ty\n", r"p.tsv:1: header .* lacks column\(s\) same"),
        ("p.tsv", "a\tb\tsame\nx\ty\t1\nonly-one\n", r"p.tsv:3: 1 fields, the header has 3"),
        ("p.csv", 'a,b,same\n"x,y,1\n', r"p.csv:\d+: "),
        ("p.jsonl", '{"a":"x","b":"y","same":1}\n{"a":"x",\n', r"p.jsonl:2: invalid JSON"),
        ("p.jsonl", '{"a":"x","same":1}\n', r"p.jsonl:1: expected an object with keys a, b"),
        ("p.jsonl", '{"a":1,"b":"y","same":1}\n', r"p.jsonl:1: 'a' and 'b' must be strings"),
        ("p.jsonl", '{"a":"x","b":"y","same":2}\n', r"p.jsonl:1: .* got 2"),
        ("p.tsv", "a\tb\tsame\n", r"p.tsv: no pairs found"),
        ("p.txt", "a b same\n", r"p.txt: unknown pairs format '.txt'"),
    ],
)
def test_bad_files_name_the_file_and_line(
    tmp_path: Path, name: str, content: str, message: str
) -> None:
    with pytest.raises(InvalidRequestError, match=message):
        read_pairs(write(tmp_path / name, content))


def test_a_missing_or_non_utf8_file_is_an_invalid_request(tmp_path: Path) -> None:
    with pytest.raises(InvalidRequestError, match="cannot read pairs"):
        read_pairs(tmp_path / "absent.tsv")
    path = tmp_path / "latin1.tsv"
    path.write_bytes("a\tb\tsame\ncaf\xe9\tx\t1\n".encode("latin-1"))
    with pytest.raises(InvalidRequestError, match="not UTF-8"):
        read_pairs(path)

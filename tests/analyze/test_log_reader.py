from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from infercache.analyze.log_reader import (
    LineErrors,
    LineFormat,
    LogReader,
    LogRecord,
    estimate_lines,
)
from infercache.errors import ConfigError
from tests.analyze.conftest import RunAnalysis
from tests.analyze.generators import write_lines


def body(text: str = "hi", **extra: object) -> dict[str, object]:
    return {"model": "m", "messages": [{"role": "user", "content": text}], **extra}


def read(*paths: Path, window: int = 4096) -> tuple[list[LogRecord], LineErrors]:
    reader = LogReader(paths, reorder_window=window)
    return list(reader), reader.errors


def test_each_line_format_is_detected_from_its_content(tmp_path: Path) -> None:
    lines = [
        json.dumps(body()),
        json.dumps(
            {
                "timestamp": 10.5,
                "request": body(),
                "tenant": "t",
                "latency_ms": 900,
                "layer": "miss",
                "prompt_tokens": 5,
                "completion_tokens": 2,
            }
        ),
        json.dumps({"timestamp": 11, "request_digest": "sha256:ab", "tenant": "t"}),
        json.dumps(
            {"timestamp": 12000, "input_length": 700, "output_length": 3, "hash_ids": [1, 2]}
        ),
    ]
    records, errors = read(write_lines(tmp_path / "mixed.log", lines))
    assert [r.kind for r in records] == [
        LineFormat.BODY,
        LineFormat.RECORD,
        LineFormat.REDACTED,
        LineFormat.BLOCKS,
    ]
    assert errors.count == 0
    gateway = records[1]
    assert (gateway.tenant, gateway.latency_s, gateway.layer) == ("t", 0.9, "miss")
    assert records[2].digest == "sha256:ab"
    assert records[3].timestamp_s == 12.0  # block traces count milliseconds
    assert records[3].hash_ids == (1, 2)
    assert records[3].prompt_tokens == 700


def test_gzip_is_detected_by_magic_bytes_not_by_name(tmp_path: Path) -> None:
    path = write_lines(tmp_path / "no-suffix.jsonl", [json.dumps(body("a"))], gz=True)
    assert path.read_bytes()[:2] == b"\x1f\x8b"
    records, _ = read(path)
    assert [r.request for r in records] == [body("a")]


def test_malformed_lines_are_counted_with_their_line_numbers_and_skipped(tmp_path: Path) -> None:
    lines = [
        json.dumps(body("ok 1")),
        "{not json",
        "[1, 2]",
        json.dumps({"hello": "world"}),
        "",
        json.dumps({"timestamp": "noon", "request": body()}),
        json.dumps({"input_length": 5, "hash_ids": []}),
        json.dumps(body("ok 2")),
    ]
    path = write_lines(tmp_path / "bad.jsonl", lines)
    records, errors = read(path)
    assert [r.line for r in records] == [1, 8]
    assert errors.count == 5
    assert [line for _, line, _ in errors.kept] == [2, 3, 4, 6, 7]
    reasons = [why for _, _, why in errors.kept]
    assert reasons[0].startswith("not JSON")
    assert "JSON object" in reasons[1]
    assert "timestamp must be a number" in reasons[3]
    assert "hash_ids" in reasons[4]
    assert all(source == str(path) for source, _, _ in errors.kept)


def test_an_empty_file_is_a_clear_error(tmp_path: Path) -> None:
    empty = tmp_path / "empty.jsonl"
    empty.write_bytes(b"")
    with pytest.raises(ConfigError, match=r"empty\.jsonl is empty"):
        read(empty)
    empty_gz = write_lines(tmp_path / "empty.jsonl.gz", [], gz=True)
    with pytest.raises(ConfigError, match="is empty"):
        read(empty_gz)


def test_a_missing_or_unreadable_file_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"cannot read log .*nope\.jsonl"):
        read(tmp_path / "nope.jsonl")
    with pytest.raises(ConfigError, match="cannot read log"):
        read(tmp_path)  # a directory


def test_a_truncated_gzip_keeps_what_was_read_and_reports_where_it_broke(tmp_path: Path) -> None:
    lines = [json.dumps(body(f"question {i} " + "x" * 200)) for i in range(400)]
    blob = gzip.compress("".join(line + "\n" for line in lines).encode(), mtime=0)
    path = tmp_path / "cut.jsonl.gz"
    path.write_bytes(blob[: len(blob) // 2])
    records, errors = read(path)
    assert 0 < len(records) < 400
    assert errors.count == 1
    assert "unreadable from here on" in errors.kept[0][2]


def test_files_are_merged_by_timestamp(tmp_path: Path) -> None:
    a = write_lines(tmp_path / "a", [json.dumps({"timestamp": t, "request": body(f"a{t}")})
                                     for t in (1, 4, 6)])  # fmt: skip
    b = write_lines(tmp_path / "b", [json.dumps({"timestamp": t, "request": body(f"b{t}")})
                                     for t in (2, 3, 7)])  # fmt: skip
    records, errors = read(a, b)
    assert [r.timestamp_s for r in records] == [1, 2, 3, 4, 6, 7]
    assert errors.out_of_order == 0


def test_jitter_within_the_reorder_window_is_sorted_and_beyond_it_counted(tmp_path: Path) -> None:
    times = [10, 12, 11, 13, 5, 14]
    path = write_lines(tmp_path / "jitter", [json.dumps({"timestamp": t, "request": body(str(t))})
                                             for t in times])  # fmt: skip
    records, errors = read(path, window=2)
    # 11 came late but within the window: sorted; 5 came far too late: kept where it
    # arrived, counted.
    assert [r.timestamp_s for r in records] == [10, 11, 5, 12, 13, 14]
    assert errors.out_of_order == 1


def test_nothing_readable_is_an_error_naming_the_bad_lines(
    tmp_path: Path, run_analysis: RunAnalysis
) -> None:
    path = write_lines(tmp_path / "junk.jsonl", ["junk", json.dumps({"model": "m"})])
    with pytest.raises(ConfigError, match=r"no request could be read .*junk\.jsonl:1: not JSON"):
        run_analysis([path])


def test_a_request_the_cache_would_refuse_is_a_malformed_line(
    tmp_path: Path, run_analysis: RunAnalysis
) -> None:
    lines = [json.dumps(body("fine")), json.dumps({"model": "m", "messages": []})]
    analysis = run_analysis([write_lines(tmp_path / "x.jsonl", lines)])
    assert analysis.census.total.requests == 1
    assert analysis.errors.kept[0][1] == 2
    assert "invalid request" in analysis.errors.kept[0][2]


def test_progress_reports_every_byte_of_the_file_once(tmp_path: Path) -> None:
    lines = [json.dumps(body(f"q{i} " + "x" * 100)) for i in range(5000)]
    path = write_lines(tmp_path / "big.jsonl.gz", lines, gz=True)
    seen: list[int] = []
    reader = LogReader([path], progress=seen.append)
    assert sum(1 for _ in reader) == 5000
    assert len(seen) > 1
    assert sum(seen) == path.stat().st_size == reader.total_bytes()


def test_gateway_timings_names_and_redacted_chains_are_read(tmp_path: Path) -> None:
    lines = [
        json.dumps({"timestamp": 1, "request": body(), "tenant": "key:ab", "tenant_name": "team-a",
                    "layer": "miss", "latency_ms": 950, "upstream_ms": 900, "ttft_ms": 120,
                    "prompt_tokens": 40, "cached_tokens": 16, "completion_tokens": 8}),
        json.dumps({"timestamp": 2, "tenant": "t", "model": "m", "key_digest": "hmac-sha256:00",
                    "prefix_hashes": [5, 6], "prefix_chunk_tokens": [4, 3],
                    "prefix_tokenizer": "chars4", "not_cacheable": "sampled without a seed"}),
        json.dumps({"timestamp": 3, "key_digest": "x", "prefix_hashes": [5],
                    "prefix_chunk_tokens": []}),
    ]  # fmt: skip
    records, errors = read(write_lines(tmp_path / "gateway.jsonl", lines))
    timed, redacted = records
    assert (timed.upstream_s, timed.ttft_s, timed.cached_tokens) == (0.9, 0.12, 16)
    assert timed.tenant_name == "team-a"
    assert redacted.kind is LineFormat.REDACTED
    assert (redacted.hash_ids, redacted.hash_chunk_tokens) == ((5, 6), (4, 3))
    assert (redacted.prefix_tokenizer, redacted.not_cacheable) == (
        "chars4",
        "sampled without a seed",
    )
    assert errors.count == 1
    assert "must pair up" in errors.kept[0][2]


@pytest.mark.parametrize("gz", [False, True])
def test_the_number_of_lines_is_estimated_from_the_head_of_each_file(
    tmp_path: Path, gz: bool
) -> None:
    lines = [json.dumps(body(f"question {i} " + "x" * (i % 50))) for i in range(20_000)]
    path = write_lines(tmp_path / "log.jsonl", lines, gz=gz)
    estimate = estimate_lines([path], probe_bytes=64 << 10)
    assert 0.8 * 20_000 < estimate < 1.25 * 20_000
    assert estimate_lines([tmp_path / "missing.jsonl"]) == 0

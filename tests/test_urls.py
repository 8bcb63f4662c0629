"""URLs as they may be shown: credentials masked, the rest intact."""

from __future__ import annotations

import pytest

from infercache.urls import has_credentials, mask_credentials, split_credentials


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("redis://:hunter2@host:6379/0", "redis://:***@host:6379/0"),
        ("redis://default:hunter2@host:6379/0", "redis://default:***@host:6379/0"),
        ("https://sk-secret@api.example.com/v1", "https://***@api.example.com/v1"),
        ("http://u:p%40ss@h/v1?x=1&token=abc", "http://u:***@h/v1?x=1&token=***"),
        ("sqlite:////tmp/c.db", "sqlite:////tmp/c.db"),
        ("redis+cluster://a:1,b:2", "redis+cluster://a:1,b:2"),
        ("memory://", "memory://"),
        ("not a url", "not a url"),
    ],
)
def test_credentials_are_masked_and_nothing_else_changes(url: str, shown: str) -> None:
    assert mask_credentials(url) == shown


def test_credentials_split_off_a_url() -> None:
    assert split_credentials("http://svc:p%40ss@127.0.0.1:8000/v1") == (
        "http://127.0.0.1:8000/v1",
        "svc",
        "p@ss",
    )
    assert split_credentials("http://h/v1") == ("http://h/v1", None, None)
    assert has_credentials("http://a:b@h")
    assert not has_credentials("http://h")

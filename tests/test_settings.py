"""Settings: defaults, TOML, environment, validation."""

from __future__ import annotations

from pathlib import Path

import pytest

from infercache.errors import ConfigError
from infercache.settings import Settings


def test_defaults_put_a_sqlite_store_in_the_data_dir(tmp_path: Path) -> None:
    s = Settings.load({"INFERCACHE_DATA_DIR": str(tmp_path)})
    assert s.resolved_store_url == f"sqlite:///{tmp_path / 'cache.sqlite3'}"
    assert s.default_ttl_s > 0


def test_environment_wins_over_the_file(tmp_path: Path) -> None:
    config = tmp_path / "infercache.toml"
    config.write_text(
        '[cache]\nstore = "memory://"\ndefault_ttl_s = 30\n'
        '[prices."gpt-x"]\ninput_usd_per_mtok = 1.5\noutput_usd_per_mtok = 6\n'
    )
    s = Settings.load({"HOME": str(tmp_path), "INFERCACHE_DEFAULT_TTL_S": "45"}, config)
    assert s.store_url == "memory://"
    assert s.default_ttl_s == 45
    assert s.prices.price("gpt-x").output_usd_per_mtok == 6


def test_prices_from_the_environment_accept_lists() -> None:
    s = Settings.load({"HOME": "/tmp", "INFERCACHE_PRICES": '{"m": [1, 2, 0.5], "*": [3, 4]}'})
    assert s.prices.price("m").cached_input_usd_per_mtok == 0.5
    assert s.prices.price("other").input_usd_per_mtok == 3


@pytest.mark.parametrize(
    "environ",
    [
        {"INFERCACHE_DEFAULT_TTL_S": "0"},
        {"INFERCACHE_DEFAULT_TTL_S": "soon"},
        {"INFERCACHE_MAX_TTL_S": "1", "INFERCACHE_DEFAULT_TTL_S": "10"},
        {"INFERCACHE_CACHE_SAMPLED": "maybe"},
        {"INFERCACHE_PRICES": "{not json"},
    ],
)
def test_bad_values_raise_config_error(environ: dict[str, str]) -> None:
    with pytest.raises(ConfigError):
        Settings.load({"HOME": "/tmp", **environ})


def test_unknown_file_settings_are_rejected(tmp_path: Path) -> None:
    config = tmp_path / "bad.toml"
    config.write_text("[cache]\ndefault_tll_s = 5\n")
    with pytest.raises(ConfigError, match="default_tll_s"):
        Settings.load({"HOME": str(tmp_path)}, config)


@pytest.mark.parametrize(
    ("table", "message"),
    [
        ("min_seen = 0", "min_seen must be at least 1"),
        ('min_seen = 2\nmatcher = "/m"', "a fitted matcher carries its own"),
    ],
)
def test_semantic_min_seen_is_the_plain_cosines_and_at_least_one(
    tmp_path: Path, table: str, message: str
) -> None:
    config = tmp_path / "infercache.toml"
    config.write_text(f"[semantic]\nthreshold = 0.9\n{table}\n")
    with pytest.raises(ConfigError, match=message):
        Settings.load({"HOME": str(tmp_path)}, config)

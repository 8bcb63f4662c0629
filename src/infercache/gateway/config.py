"""The gateway's frozen settings: from `[gateway]` in the config file, then CLI flags, then
secrets from the environment (`INFERCACHE_UPSTREAM_API_KEY`, `INFERCACHE_ADMIN_TOKEN`).

    [gateway]
    host = "127.0.0.1"
    port = 8080
    upstreams = ["http://127.0.0.1:8000/v1"]   # none: the built-in engine, in process
    api_keys = { "sk-team-a" = "team-a" }       # key = tenant; none: open, see auth.py
    max_body_bytes = 4194304
    request_log = "requests.jsonl"
    redact = false
    version_poll_s = 30
    use_fingerprints = true                     # a new system_fingerprint is a model swap
    upstream_timeout_s = 600
"""

from __future__ import annotations

import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from infercache.errors import ConfigError


@dataclass(frozen=True, slots=True)
class GatewayConfig:
    host: str = "127.0.0.1"
    port: int = 8080
    upstreams: tuple[str, ...] = ()
    upstream_api_key: str | None = None
    api_keys: Mapping[str, str] = field(default_factory=dict)
    admin_token: str | None = None
    max_body_bytes: int = 4 << 20
    request_log: Path | None = None
    redact: bool = False
    version_poll_s: float | None = 30.0
    use_fingerprints: bool = True
    upstream_timeout_s: float = 600.0

    def __post_init__(self) -> None:
        if not 0 < self.port < 65536:
            raise ConfigError(f"port must be 1..65535, got {self.port}")
        if self.max_body_bytes < 1024:
            raise ConfigError(f"max_body_bytes must be >= 1024, got {self.max_body_bytes}")
        for url in self.upstreams:
            if not url.startswith(("http://", "https://")):
                raise ConfigError(f"an upstream must be an http(s) URL, got {url!r}")
        if self.admin_token is not None and self.admin_token in self.api_keys:
            raise ConfigError("the admin token must differ from every tenant API key")

    def with_toml(self, path: Path) -> GatewayConfig:
        try:
            section = tomllib.loads(path.read_text()).get("gateway", {})
        except (OSError, tomllib.TOMLDecodeError) as exc:
            raise ConfigError(f"cannot read config file {path}: {exc}") from exc
        return self.with_values(section, source=str(path))

    def with_values(self, values: Mapping[str, Any], *, source: str) -> GatewayConfig:
        known = {f for f in self.__dataclass_fields__}
        unknown = set(values) - known
        if unknown:
            raise ConfigError(f"{source}: unknown [gateway] setting(s) {sorted(unknown)}")
        changes = dict(values)
        if "upstreams" in changes:
            changes["upstreams"] = tuple(changes["upstreams"])
        if changes.get("request_log") is not None:
            changes["request_log"] = Path(changes["request_log"]).expanduser()
        try:
            return replace(self, **changes)
        except (TypeError, ValueError) as exc:
            raise ConfigError(f"{source}: {exc}") from exc

    def with_env(self, environ: Mapping[str, str]) -> GatewayConfig:
        changes: dict[str, Any] = {}
        if environ.get("INFERCACHE_UPSTREAM_API_KEY"):
            changes["upstream_api_key"] = environ["INFERCACHE_UPSTREAM_API_KEY"]
        if environ.get("INFERCACHE_ADMIN_TOKEN"):
            changes["admin_token"] = environ["INFERCACHE_ADMIN_TOKEN"]
        return replace(self, **changes) if changes else self


def parse_api_keys(pairs: list[str]) -> dict[str, str]:
    keys: dict[str, str] = {}
    for pair in pairs:
        key, sep, tenant = pair.partition("=")
        if not sep or not key or not tenant:
            raise ConfigError(f"--api-key takes KEY=TENANT, got {pair!r}")
        keys[key] = tenant
    return keys


def normalise_upstream(url: str) -> str:
    """An OpenAI base URL: `http://host:port` becomes `http://host:port/v1`."""
    url = url.rstrip("/")
    rest = url.partition("://")[2]
    if "/" not in rest:
        url += "/v1"
    return url

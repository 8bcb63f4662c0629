"""The gateway's frozen settings: from `[gateway]` in the config file, then CLI flags, then
secrets from the environment (`INFERCACHE_UPSTREAM_API_KEY`, `INFERCACHE_ADMIN_TOKEN`,
`INFERCACHE_METRICS_TOKEN`, and each upstream's own `key_env`).

    [gateway]
    host = "127.0.0.1"
    port = 8080
    upstreams = ["http://127.0.0.1:8000/v1"]   # none: the built-in engine, in process
    # or, per upstream: its kind (openai, vllm, sglang, anthropic) and the environment
    # variable holding its API key
    # upstreams = [{ url = "https://api.openai.com/v1", key_env = "OPENAI_API_KEY" }]
    api_keys = { "sk-team-a" = "team-a" }       # key = tenant; none: open, see auth.py
    forward_client_key = false                  # open mode only: send the caller's bearer on
    forward_headers = ["x-my-trace"]            # client headers passed through on purpose
    max_body_bytes = 4194304
    request_log = "requests.jsonl"
    redact = false
    version_poll_s = 30
    use_fingerprints = true                     # fingerprints that displace the earlier
    fingerprint_swap_s = 60                     # ones for this long and this many answers
    fingerprint_swap_answers = 20               # are a model swap (gateway/fingerprints.py)
    upstream_timeout_s = 600
    store_budget_s = 0.05                       # a store call over this is a counted miss
    store_optional = false                      # start (degraded) when the store is unreachable
    share_flights = true                        # Redis store: one call per key across gateways
    anthropic_breakpoints = "inject"            # or pass, strip (Anthropic upstreams)
    anthropic_breakpoints_by_tenant = { "team-a" = "strip" }
    replica_lease_s = 10                        # a dead gateway's call is taken over after it

Credentials: an upstream is called with its own key (its `key_env`, else
`INFERCACHE_UPSTREAM_API_KEY`), or with none. A client's gateway key is never forwarded, in any
header; a passed-through request carries only the client headers gateway/forwarding.py allows
(and `forward_headers`); the caller's own bearer goes upstream only with `forward_client_key`,
which needs open mode. A URL's
`user:password@` becomes HTTP Basic auth and is masked wherever the URL is shown (urls.py).
"""

from __future__ import annotations

import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from infercache.errors import ConfigError
from infercache.gateway.forwarding import CREDENTIAL_HEADERS
from infercache.urls import has_credentials, mask_credentials

UPSTREAM_KINDS = ("openai", "vllm", "sglang", "anthropic")
BREAKPOINT_POLICIES = ("inject", "pass", "strip")


@dataclass(frozen=True, slots=True)
class UpstreamSpec:
    """One upstream: its base URL, what kind of server it is, and where its API key lives."""

    url: str
    kind: str = "openai"
    key_env: str | None = None  # the environment variable holding its API key

    def __post_init__(self) -> None:
        if not self.url.startswith(("http://", "https://")):
            raise ConfigError(
                f"an upstream must be an http(s) URL, got {mask_credentials(self.url)!r}"
            )
        if self.kind not in UPSTREAM_KINDS:
            raise ConfigError(f"upstream kind must be one of {UPSTREAM_KINDS}, got {self.kind!r}")

    @classmethod
    def parse(cls, text: str) -> UpstreamSpec:
        """`URL[,kind=openai|vllm|sglang|anthropic][,key_env=VAR]` (`--upstream`'s syntax)."""
        url, *options = text.split(",")
        values: dict[str, str] = {}
        for option in options:
            name, sep, value = option.partition("=")
            if not sep or name.strip() not in ("kind", "key_env") or not value.strip():
                raise ConfigError(
                    f"--upstream takes URL[,kind=...][,key_env=VAR], got option {option!r}"
                )
            values[name.strip()] = value.strip()
        return cls(normalise_upstream(url.strip()), **values)

    @classmethod
    def of(cls, value: object) -> UpstreamSpec:
        """From a config value: a URL string, a table, or a spec."""
        if isinstance(value, UpstreamSpec):
            return value
        if isinstance(value, str):
            return cls.parse(value)
        if isinstance(value, Mapping):
            unknown = set(value) - {"url", "kind", "key_env"}
            if unknown or not isinstance(value.get("url"), str):
                raise ConfigError(f"an upstream table takes url, kind, key_env: got {dict(value)}")
            return cls(
                normalise_upstream(value["url"]),
                **{k: str(v) for k, v in value.items() if k != "url"},
            )
        raise ConfigError(f"an upstream is a URL or a table, got {value!r}")


@dataclass(frozen=True, slots=True)
class GatewayConfig:
    host: str = "127.0.0.1"
    port: int = 8080
    upstreams: tuple[UpstreamSpec, ...] = ()
    upstream_api_key: str | None = None  # the default key of upstreams without key_env
    upstream_keys: Mapping[str, str] = field(default_factory=dict)  # url → key, from key_env
    forward_client_key: bool = False
    forward_headers: tuple[str, ...] = ()  # client headers passed through beyond forwarding.py's
    api_keys: Mapping[str, str] = field(default_factory=dict)
    admin_token: str | None = None
    metrics_token: str | None = None
    max_body_bytes: int = 4 << 20
    request_log: Path | None = None
    redact: bool = False
    version_poll_s: float | None = 30.0
    use_fingerprints: bool = True
    fingerprint_swap_s: float = 60.0
    fingerprint_swap_answers: int = 20
    upstream_timeout_s: float = 600.0
    store_budget_s: float = 0.05
    store_optional: bool = False  # start degraded, not refuse, when the store does not answer
    share_flights: bool = True  # with a Redis store: one upstream call per key across gateways
    replica_lease_s: float = 10.0  # a dead gateway's call is taken over after this long
    otel: bool = False  # a span per request to OTEL_EXPORTER_OTLP_ENDPOINT (tracing.py)
    # Anthropic upstreams' `cache_control` breakpoints (gateway/messages_endpoint.py): inject
    # (only on prefixes seen before), pass, or strip; per tenant, over the default.
    anthropic_breakpoints: str = "inject"
    anthropic_breakpoints_by_tenant: Mapping[str, str] = field(default_factory=dict)
    # Mixed into each tenant's vLLM/SGLang `cache_salt`; give every gateway of one deployment
    # the same (INFERCACHE_CACHE_SALT_SECRET), else each uses its data dir's secret.
    salt_secret: bytes | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "upstreams", tuple(UpstreamSpec.of(u) for u in self.upstreams))
        object.__setattr__(self, "forward_headers", tuple(h.lower() for h in self.forward_headers))
        never = {*CREDENTIAL_HEADERS, "proxy-authorization", "cookie"}
        credential = set(self.forward_headers) & never
        if credential:
            raise ConfigError(
                f"forward_headers cannot name a credential header {sorted(credential)}: a "
                "client's key is never sent upstream (see forward_client_key)"
            )
        if not 0 < self.port < 65536:
            raise ConfigError(f"port must be 1..65535, got {self.port}")
        if self.max_body_bytes < 1024:
            raise ConfigError(f"max_body_bytes must be >= 1024, got {self.max_body_bytes}")
        if self.fingerprint_swap_s < 0 or self.fingerprint_swap_answers < 1:
            raise ConfigError(
                "fingerprint_swap_s must be >= 0 and fingerprint_swap_answers >= 1, got "
                f"{self.fingerprint_swap_s} and {self.fingerprint_swap_answers}"
            )
        for policy in (self.anthropic_breakpoints, *self.anthropic_breakpoints_by_tenant.values()):
            if policy not in BREAKPOINT_POLICIES:
                raise ConfigError(
                    f"anthropic_breakpoints must be one of {BREAKPOINT_POLICIES}, got {policy!r}"
                )
        if not 0 < self.store_budget_s <= 60:
            raise ConfigError(f"store_budget_s must be in (0, 60], got {self.store_budget_s}")
        if self.admin_token is not None and self.admin_token in self.api_keys:
            raise ConfigError("the admin token must differ from every tenant API key")
        if self.forward_client_key and self.api_keys:
            raise ConfigError(
                "forward_client_key needs open mode: with --api-key, the caller's bearer is a "
                "gateway key, and a gateway key is never sent upstream"
            )
        for spec in self.upstreams:
            if has_credentials(spec.url) and (
                self.forward_client_key or self.key_for(spec) is not None
            ):
                raise ConfigError(
                    f"upstream {mask_credentials(spec.url)} has credentials in its URL and an "
                    "API key: give it one or the other"
                )

    def key_for(self, spec: UpstreamSpec) -> str | None:
        """The API key the gateway sends to this upstream (never a client's gateway key)."""
        if spec.key_env is not None:
            return self.upstream_keys.get(spec.url)
        return self.upstream_api_key

    def with_toml(self, path: Path) -> GatewayConfig:
        try:
            section = tomllib.loads(path.read_text()).get("gateway", {})
        except (OSError, tomllib.TOMLDecodeError) as exc:
            raise ConfigError(f"cannot read config file {path}: {exc}") from exc
        return self.with_values(section, source=str(path))

    def with_values(self, values: Mapping[str, Any], *, source: str) -> GatewayConfig:
        known = set(self.__dataclass_fields__) - {"upstream_keys", "salt_secret"}
        unknown = set(values) - known
        if unknown:
            raise ConfigError(f"{source}: unknown [gateway] setting(s) {sorted(unknown)}")
        changes = dict(values)
        if "upstreams" in changes:
            changes["upstreams"] = tuple(UpstreamSpec.of(u) for u in changes["upstreams"])
        if changes.get("request_log") is not None:
            changes["request_log"] = Path(changes["request_log"]).expanduser()
        try:
            return replace(self, **changes)
        except (TypeError, ValueError) as exc:
            raise ConfigError(f"{source}: {exc}") from exc

    def with_env(self, environ: Mapping[str, str]) -> GatewayConfig:
        """Secrets from the environment: the default upstream key, the admin and metrics tokens,
        and each upstream's `key_env` (a named variable that is unset is an error)."""
        changes: dict[str, Any] = {}
        for var, name in (
            ("INFERCACHE_UPSTREAM_API_KEY", "upstream_api_key"),
            ("INFERCACHE_ADMIN_TOKEN", "admin_token"),
            ("INFERCACHE_METRICS_TOKEN", "metrics_token"),
        ):
            if environ.get(var):
                changes[name] = environ[var]
        if environ.get("OTEL_EXPORTER_OTLP_ENDPOINT"):
            changes["otel"] = True
        if environ.get("INFERCACHE_CACHE_SALT_SECRET"):
            changes["salt_secret"] = environ["INFERCACHE_CACHE_SALT_SECRET"].encode()
        keys: dict[str, str] = {}
        for spec in self.upstreams:
            if spec.key_env is None:
                continue
            if not environ.get(spec.key_env):
                raise ConfigError(
                    f"upstream {mask_credentials(spec.url)} takes its key from ${spec.key_env}, "
                    "which is not set"
                )
            keys[spec.url] = environ[spec.key_env]
        if keys:
            changes["upstream_keys"] = keys
        return replace(self, **changes) if changes else self


def parse_breakpoints(values: list[str]) -> dict[str, Any]:
    """`--anthropic-breakpoints POLICY` (the default) and `TENANT=POLICY` (repeatable) as
    [gateway] settings."""
    out: dict[str, Any] = {}
    by_tenant: dict[str, str] = {}
    for value in values:
        tenant, sep, policy = value.rpartition("=")
        if sep and tenant:
            by_tenant[tenant] = policy
        else:
            out["anthropic_breakpoints"] = policy
    if by_tenant:
        out["anthropic_breakpoints_by_tenant"] = by_tenant
    return out


def parse_api_keys(pairs: list[str]) -> dict[str, str]:
    keys: dict[str, str] = {}
    for pair in pairs:
        key, sep, tenant = pair.partition("=")
        if not sep or not key or not tenant:
            raise ConfigError("--api-key takes KEY=TENANT (the value given is not shown)")
        keys[key] = tenant
    return keys


def normalise_upstream(url: str) -> str:
    """An OpenAI base URL: `http://host:port` becomes `http://host:port/v1`."""
    url = url.rstrip("/")
    rest = url.partition("://")[2]
    if "/" not in rest:
        url += "/v1"
    return url

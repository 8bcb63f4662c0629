"""Property-based fuzzing of a running gateway (real loopback HTTP, the stand-in upstream behind):
Hypothesis makes methods, paths, headers and bodies — mutated chat requests, arbitrary JSON,
raw bytes — and every answer must be below 500, in the OpenAI error shape when it is an error,
and nothing a refused request carried may be stored.

CI runs a small number of examples; `bench/fuzz.py` runs 10,000 and records the figures
(`INFERCACHE_FUZZ_EXAMPLES`, `INFERCACHE_FUZZ_REPORT`)."""

from __future__ import annotations

import collections
import json
import os
from pathlib import Path
from typing import Any

import httpx
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.gateway.conftest import MakeGateway, body

EXAMPLES = int(os.environ.get("INFERCACHE_FUZZ_EXAMPLES", "400"))

JSON = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**80), max_value=2**80)
    | st.floats(allow_nan=False)
    | st.text(max_size=40),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=12), inner, max_size=4)
    ),
    max_leaves=12,
)
FIELDS = [
    "model", "messages", "temperature", "top_p", "max_tokens", "max_completion_tokens", "n",
    "seed", "stream", "stream_options", "stop", "tools", "response_format", "logit_bias",
    "logprobs", "top_logprobs", "user", "infercache", "presence_penalty", "x_unknown",
]  # fmt: skip
DIRECTIVE_FIELDS = ["tenant", "tags", "context", "ttl_s", "max_age_s", "cache_control", "other"]
PATHS = [
    "/v1/chat/completions", "/v1/models", "/stats", "/metrics", "/healthz", "/admin/invalidate",
    "/admin/model-version", "/v1/embeddings", "/", "/v1/chat/completions/x", "/%ff",
]  # fmt: skip
HEADER_NAMES = [
    "authorization", "cache-control", "x-infercache-tags", "x-infercache-context",
    "x-infercache-tenant", "content-type", "content-length", "x-other",
]  # fmt: skip
HEADER_VALUE = st.text(st.characters(min_codepoint=32, max_codepoint=255), max_size=60)
CACHE_CONTROL = (
    st.sampled_from(
        ["no-cache", "no-store", "only-if-cached", "max-age=5", "max-age=x", "max-age=²", ""]
    )
    | HEADER_VALUE
)


@st.composite
def chat_bodies(draw: st.DrawFn) -> Any:
    """A valid chat body with a few fields replaced, removed or added."""
    out: dict[str, Any] = body(draw(st.text(max_size=30)))
    for name in draw(st.lists(st.sampled_from(FIELDS), max_size=3)):
        if draw(st.booleans()):
            out[name] = draw(JSON)
        else:
            out.pop(name, None)
    if draw(st.booleans()):
        directives = {n: draw(JSON) for n in draw(st.lists(st.sampled_from(DIRECTIVE_FIELDS)))}
        out["infercache"] = directives
    return out


@st.composite
def requests(draw: st.DrawFn) -> dict[str, Any]:
    # Weighted towards requests that get past routing and auth, into the cache's own checks.
    method = draw(st.sampled_from(["POST"] * 20 + ["GET", "PUT", "DELETE", "PATCH", "OPTIONS"]))
    path = draw(st.sampled_from(["/v1/chat/completions"] * 20 + PATHS))
    headers = {}
    for name in draw(st.lists(st.sampled_from(HEADER_NAMES), max_size=3, unique=True)):
        if name == "content-length":
            continue  # httpx sets it; a wrong one only makes the client hang
        value = draw(CACHE_CONTROL if name == "cache-control" else HEADER_VALUE)
        headers[name] = value.strip(" \t").encode("latin-1")  # what HTTP/1.1 can carry
    kind = draw(st.sampled_from(["chat"] * 6 + ["json", "bytes"]))
    if kind == "chat":
        content = json.dumps(draw(chat_bodies())).encode()
    elif kind == "json":
        content = json.dumps(draw(JSON)).encode()
    else:
        content = draw(st.binary(max_size=200))
    return {"method": method, "url": path, "headers": headers, "content": content}


def test_fuzzed_requests_never_get_a_5xx_and_refusals_store_nothing(
    make_gateway: MakeGateway,
) -> None:
    running = make_gateway(api_keys={"sk-fuzz": "fuzz"}, admin_token="adm-fuzz")
    statuses: collections.Counter[int] = collections.Counter()
    fetched = 0
    client = httpx.Client(base_url=running.url, timeout=30)

    @settings(
        max_examples=EXAMPLES,
        deadline=None,
        database=None,
        suppress_health_check=list(HealthCheck),
    )
    @given(request=requests(), authorized=st.sampled_from([True] * 9 + [False]))
    def one(request: dict[str, Any], authorized: bool) -> None:
        nonlocal fetched
        if authorized:
            request["headers"]["authorization"] = b"Bearer sk-fuzz"
        response = client.request(**request)
        statuses[response.status_code] += 1
        if response.status_code >= 400:
            error = response.json()["error"]
            assert set(error) >= {"message", "type", "param", "code"}
            if response.status_code == 504 and error["code"] == "not_cached":
                return  # `only-if-cached` with nothing cached: HTTP's own 504 (RFC 9111)
        assert response.status_code < 500, (request, response.status_code, response.text)
        if response.status_code < 400 and response.headers.get("x-infercache") in (
            "miss",
            "bypass",
        ):
            fetched += 1

    one()
    client.close()
    with running.client("adm-fuzz") as admin:
        assert admin.get("/healthz").status_code == 200  # alive afterwards
        assert admin.post("/v1/chat/completions", json=body()).status_code == 401
    stored = running.exact()["counters"].get("stored", 0)
    assert stored <= fetched  # only answered, fetched requests were ever stored
    report = {
        "requests": sum(statuses.values()),
        "status_5xx": sum(n for s, n in statuses.items() if s >= 500 and s != 504),
        "only_if_cached_504": statuses.get(504, 0),
        "by_status": dict(sorted(statuses.items())),
        "answers_fetched": fetched,
        "entries_stored": stored,
        "entries_stored_from_refused_requests": max(0, stored - fetched),
    }
    if os.environ.get("INFERCACHE_FUZZ_REPORT"):
        Path(os.environ["INFERCACHE_FUZZ_REPORT"]).write_text(json.dumps(report, indent=2))
    assert report["requests"] >= EXAMPLES

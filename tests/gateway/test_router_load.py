"""Routing on the replicas' own load: stand-in vLLM and SGLang servers on loopback serve a
`/metrics` page, the load poller reads it into the router, and the router prefers the less
loaded replica when prefixes tie, and gives up a warm replica whose queue is far longer."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from contextlib import ExitStack
from typing import Any

import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response
from starlette.routing import Route

from infercache.clock import ManualClock
from infercache.engine.accounting import EngineAccounting
from infercache.gateway.replica_load import LoadPoller, parse_load
from infercache.gateway.router import PrefixRouter, ReplicaLoad, RouterConfig
from infercache.gateway.upstream import HTTPUpstream
from infercache.metrics import Metrics
from tests.gateway.conftest import MakeGateway, body
from tests.harness.servers import serve

SYSTEM = "You are the support assistant of ACME. " * 40


def req(question: str, system: str = SYSTEM) -> dict[str, Any]:
    return {
        "model": "m",
        "messages": [
            {"role": "system", "content": system},
            {"role": "user", "content": question},
        ],
    }


def vllm_page(waiting: int, running: int = 0, kv: float = 0.1) -> str:
    return (
        "# HELP vllm:num_requests_waiting Number of requests waiting to be processed.\n"
        "# TYPE vllm:num_requests_waiting gauge\n"
        f'vllm:num_requests_waiting{{engine="0",model_name="m"}} {waiting}.0\n'
        "# TYPE vllm:num_requests_running gauge\n"
        f'vllm:num_requests_running{{engine="0",model_name="m"}} {running}.0\n'
        "# TYPE vllm:kv_cache_usage_perc gauge\n"
        f'vllm:kv_cache_usage_perc{{engine="0",model_name="m"}} {kv}\n'
        "# TYPE vllm:prompt_tokens counter\n"
        'vllm:prompt_tokens_total{engine="0",model_name="m"} 1234.0\n'
    )


def sglang_page(queued: int, running: int = 0) -> str:
    return (
        "# TYPE sglang:num_queue_reqs gauge\n"
        f'sglang:num_queue_reqs{{model_name="m",tp_rank="0"}} {queued}.0\n'
        f'sglang:num_queue_reqs{{model_name="m",tp_rank="1"}} {queued}.0\n'
        "# TYPE sglang:num_running_reqs gauge\n"
        f'sglang:num_running_reqs{{model_name="m",tp_rank="0"}} {running}.0\n'
        "# TYPE sglang:token_usage gauge\n"
        'sglang:token_usage{model_name="m",tp_rank="0"} 0.5\n'
    )


class MetricsServer:
    """A stand-in engine's `/metrics`: the page it serves can change; it can fail."""

    def __init__(self, page: str) -> None:
        self.page = page
        self.status = 200
        self.read = threading.Event()
        self.app = Starlette(routes=[Route("/metrics", self.metrics, methods=["GET"])])

    async def metrics(self, _request: Request) -> Response:
        self.read.set()
        return PlainTextResponse(self.page, status_code=self.status)


@pytest.fixture
def servers() -> Iterator[tuple[list[MetricsServer], list[str]]]:
    stand_ins = [MetricsServer(vllm_page(0)), MetricsServer(sglang_page(0))]
    with ExitStack() as stack:
        urls = [stack.enter_context(serve(s.app)) for s in stand_ins]
        yield stand_ins, urls


def upstreams(urls: list[str]) -> list[HTTPUpstream]:
    return [
        HTTPUpstream(f"{url}/v1", kind=kind, salt_secret=b"s")
        for url, kind in zip(urls, ("vllm", "sglang"), strict=True)
    ]


def poll(router: PrefixRouter[Any], replicas: list[HTTPUpstream]) -> list[bool]:
    async def run() -> list[bool]:
        poller = LoadPoller(router, replicas)
        try:
            return [await poller.poll_once(i) for i in poller.polled]
        finally:
            for replica in replicas:
                await replica.aclose()

    return asyncio.run(run())


def test_each_engines_series_are_read() -> None:
    assert parse_load(vllm_page(5, running=3, kv=0.8)) == ReplicaLoad(5, 3, 0.8)
    assert parse_load(sglang_page(4, running=1)) == ReplicaLoad(8, 1, 0.5)  # ranks summed
    assert parse_load("# TYPE other gauge\nother 3\n") is None  # nothing about load
    with pytest.raises(ValueError, match="could not convert"):
        parse_load("this is not { prometheus\n")


def test_the_built_in_engines_gauges_are_read_as_its_server_exports_them() -> None:
    metrics = Metrics()
    accounting = EngineAccounting(metrics, prefix_cache_enabled=True)
    accounting.record_queue(7, [])
    load = parse_load(metrics.to_prometheus().decode())
    assert load is not None
    assert (load.waiting, load.running) == (7, 0)


def test_with_equal_prefixes_the_less_loaded_replica_is_preferred(
    servers: tuple[list[MetricsServer], list[str]],
) -> None:
    stand_ins, urls = servers
    clock = ManualClock()
    router: PrefixRouter[str] = PrefixRouter(["vllm", "sglang"], monotonic_s=clock.monotonic_s)
    stand_ins[0].page = vllm_page(waiting=3)
    assert poll(router, upstreams(urls)) == [True, True]
    assert router.route("t", req("q0"))[0] == 1  # nothing warm: the idle one
    router.route("t", req("q1", system="x" * 300))
    # Both replicas now hold nothing of a new prompt's prefix, and both hold the system prompt:
    router._record(router._replicas[0], router._replicas[1].blocks)
    stand_ins[0].page, stand_ins[1].page = vllm_page(0), sglang_page(3)  # 6 queued, 2 ranks
    assert poll(router, upstreams(urls)) == [True, True]
    index, matched = router.route("t", req("q2"))
    assert matched > 0
    assert index == 0  # the prefix ties: the one with the shorter queue


def test_a_warm_replica_loses_its_preference_only_when_its_queue_is_far_longer(
    servers: tuple[list[MetricsServer], list[str]],
) -> None:
    stand_ins, urls = servers
    clock = ManualClock()
    config = RouterConfig(imbalance_abs=4, imbalance_rel=1.5)
    router: PrefixRouter[str] = PrefixRouter(
        ["vllm", "sglang"], config, monotonic_s=clock.monotonic_s
    )
    warm, _ = router.route("t", req("q0"))
    assert warm == 0
    stand_ins[0].page = vllm_page(waiting=3, running=1)  # 4 vs 0: longer, not far longer
    poll(router, upstreams(urls))
    assert router.route("t", req("q1"))[0] == warm
    stand_ins[0].page = vllm_page(waiting=12, running=3)  # 15 vs 10 (5 per rank, 0 running)
    stand_ins[1].page = sglang_page(queued=5)
    poll(router, upstreams(urls))
    assert router.route("t", req("q2"))[0] == warm  # 5 more, but not over 1.5 x as many
    stand_ins[1].page = sglang_page(queued=1)  # 15 vs 2: far longer
    poll(router, upstreams(urls))
    assert router.loads() == [15, 2]
    assert router.route("t", req("q3"))[0] == 1
    clock.advance(config.load_stale_s + 0.1)  # the reports age out: the router's own count
    assert router.loads() == [0, 0]
    # Both hold the system prompt now; equal load: the one that served fewer requests.
    assert router.route("t", req("q4"))[0] == 1


def test_a_failed_metrics_read_is_unknown_load_and_ejects_nobody(
    servers: tuple[list[MetricsServer], list[str]],
) -> None:
    stand_ins, urls = servers
    clock = ManualClock()
    router: PrefixRouter[str] = PrefixRouter(["vllm", "sglang"], monotonic_s=clock.monotonic_s)
    stand_ins[1].page = sglang_page(queued=20)
    assert poll(router, upstreams(urls)) == [True, True]
    assert router.loads() == [0, 40]
    stand_ins[1].status = 500
    stand_ins[0].page = "not { prometheus"
    assert poll(router, upstreams(urls)) == [False, False]
    assert router.loads() == [0, 0]  # unknown: not the stale 40
    assert router.health() == ["healthy", "healthy"]
    stand_ins[1].status = 200
    gone = upstreams(urls)
    gone[0] = HTTPUpstream("http://127.0.0.1:9/v1", kind="vllm", salt_secret=b"s")  # nobody
    assert poll(router, gone) == [False, True]
    assert router.health() == ["healthy", "healthy"]


def test_failed_reads_back_off_and_successful_ones_keep_the_interval() -> None:
    class Flaky:
        def __init__(self) -> None:
            self.answers = ["not { prometheus", "not { prometheus", vllm_page(1), vllm_page(1)]

        async def metrics_text(self) -> str:
            return self.answers.pop(0)

    waits: list[float] = []

    async def sleep(seconds: float) -> None:
        waits.append(seconds)
        if len(waits) == 4:
            raise asyncio.CancelledError

    async def run() -> None:
        router: PrefixRouter[str] = PrefixRouter(["a", "b"], RouterConfig(load_poll_s=0.5))
        poller = LoadPoller(router, [Flaky(), Flaky()], sleep=sleep)
        assert poller.polled == [0, 1]
        with pytest.raises(asyncio.CancelledError):
            await poller._poll_forever(0)

    asyncio.run(run())
    assert waits == [1.0, 2.0, 0.5, 0.5]


def test_a_served_gateway_reads_its_replicas_load(
    make_gateway: MakeGateway, servers: tuple[list[MetricsServer], list[str]]
) -> None:
    stand_ins, urls = servers
    running = make_gateway(upstreams=(f"{urls[0]}/v1,kind=vllm", f"{urls[1]}/v1,kind=sglang"))
    assert running.built.gateway.load_poller.polled == [0, 1]
    assert all(s.read.wait(30) for s in stand_ins)  # each polled from the gateway's loop


def test_one_replica_is_not_polled(make_gateway: MakeGateway) -> None:
    running = make_gateway()
    assert running.built.gateway.load_poller.polled == []
    with running.client() as client:
        assert client.post("/v1/chat/completions", json=body("q")).status_code == 200

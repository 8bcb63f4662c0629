"""The gateway's router (app.StaticFirstRouter) routes every request as Starlette's own does:
the dict it looks static paths up in first changes the cost, never the route taken."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response
from starlette.routing import Route, Router
from starlette.testclient import TestClient

from infercache.gateway.app import StaticFirstRouter
from infercache.http_errors import exception_handlers, middleware


def answering(name: str) -> Callable[[Request], Awaitable[Response]]:
    async def endpoint(request: Request) -> Response:
        params = ",".join(f"{k}={v}" for k, v in request.path_params.items())
        return PlainTextResponse(f"{name} {request.scope['route'].path} {params}")

    return endpoint


ROUTES = [
    Route("/s", answering("static"), methods=["POST"]),
    Route("/t", answering("static-get"), methods=["GET"]),
    Route("/a/{x}", answering("param")),
    Route("/a/b", answering("shadowed")),  # after a route that matches it: never reached
    Route("/late", answering("late"), methods=["GET"]),
    Route("/{rest:path}", answering("rest"), methods=["GET", "POST"]),
]


def client(router_class: type[Router]) -> TestClient:
    app = Starlette(exception_handlers=exception_handlers(), middleware=middleware())
    app.router = router_class(ROUTES)
    return TestClient(app, follow_redirects=False)


def test_every_request_takes_the_route_starlettes_router_takes() -> None:
    ours, theirs = client(StaticFirstRouter), client(Router)
    requests = [
        ("POST", "/s"), ("GET", "/s"), ("HEAD", "/t"), ("GET", "/t"), ("POST", "/t"),
        ("GET", "/a/b"), ("GET", "/a/c"), ("GET", "/late"), ("POST", "/late"), ("GET", "/s/"),
        ("PUT", "/nowhere"), ("GET", "/"),
    ]  # fmt: skip
    for method, path in requests:
        got, want = ours.request(method, path), theirs.request(method, path)
        assert (got.status_code, got.text, got.headers.get("allow")) == (
            want.status_code,
            want.text,
            want.headers.get("allow"),
        ), (method, path)
    assert ours.post("/s").text == "static /s "
    assert ours.get("/a/b").text == "param /a/{x} x=b"
    assert ours.get("/s").text == "rest /{rest:path} rest=s"  # the scan's catch-all, as theirs
    assert ours.post("/late").status_code == 200  # a later route takes another method

"""A rollout's assignment (issue 29 item 2), pure: a share of units by hash, the same in every
process, stable as a conversation grows, and a raised share only adds units."""

from __future__ import annotations

import statistics

import pytest

from infercache.errors import InvalidRequestError
from infercache.gateway.rollout import Arm, Rollout, conversation

TENANTS = [f"tenant-{i:03d}" for i in range(200)]


def on_canary(rollout: Rollout) -> set[str]:
    return {t for t in TENANTS if rollout.arm(t, {"messages": []}) is Arm.CANARY}


def test_a_tenth_of_the_tenants_over_many_declarations() -> None:
    shares = [
        len(on_canary(Rollout(("http://b/v1",), share=0.1, version=f"v{n}"))) / len(TENANTS)
        for n in range(100)
    ]
    assert 0.09 <= statistics.mean(shares) <= 0.11
    # 200 tenants at p = 0.1 (sd 4.2 tenants): 16-24 on the canary has probability 0.71 for
    # one declaration; 100 declarations give 71 on average (sd 4.5).
    assert sum(1 for s in shares if 0.08 <= s <= 0.12) >= 60


def test_a_raised_share_keeps_every_tenant_already_on_the_canary() -> None:
    small = on_canary(Rollout(("http://b/v1",), share=0.1, version="v2"))
    large = on_canary(Rollout(("http://b/v1",), share=0.3, version="v2"))
    assert small < large


def test_a_conversation_hashes_the_same_on_every_turn() -> None:
    opening = [{"role": "system", "content": "s"}, {"role": "user", "content": "hello"}]
    later = [*opening, {"role": "assistant", "content": "hi"}, {"role": "user", "content": "more"}]
    assert conversation({"messages": opening}) == conversation({"messages": later})
    assert conversation({"messages": opening}) != conversation(
        {"messages": [{"role": "user", "content": "another"}]}
    )


@pytest.mark.parametrize(
    "declaration",
    [{"canary": []}, {"canary": ["u"], "share": 1.5}, {"canary": ["u"], "sticky": "user"},
     {"canary": ["u"], "colour": "red"}],
)  # fmt: skip
def test_a_bad_declaration_is_a_400(declaration: dict[str, object]) -> None:
    with pytest.raises(InvalidRequestError):
        Rollout.of(declaration)


def test_serve_declares_a_rollout_from_its_flags() -> None:
    from infercache.cli import build_parser
    from infercache.gateway.cli import _config

    argv = ["serve", "--upstream", "http://a/v1", "--upstream", "http://b/v1"]
    argv += ["--canary", "http://b/v1", "--canary-share", "0.1", "--sticky", "conversation"]
    config = _config(build_parser().parse_args(argv))
    assert config.rollout is not None
    assert Rollout.of(config.rollout) == Rollout(("http://b/v1",), share=0.1, sticky="conversation")
    assert _config(build_parser().parse_args(argv[:5])).rollout is None

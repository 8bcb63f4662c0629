"""Every option of every sub-command says what it does and, when it takes a value, its default
(issue 26 item 10): the test walks the parsers `infercache` builds, so a command added later is
held to it too."""

from __future__ import annotations

import argparse
from collections.abc import Iterator

import pytest

from infercache.cli import build_parser


def _walk(
    parser: argparse.ArgumentParser, path: tuple[str, ...] = ()
) -> Iterator[tuple[str, argparse.Action]]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from _walk(sub, (*path, name))
        elif not isinstance(action, argparse._HelpAction | argparse._VersionAction):
            yield " ".join(path), action


ACTIONS = list(_walk(build_parser()))


def _id(item: tuple[str, argparse.Action]) -> str:
    command, action = item
    return f"{command} {'/'.join(action.option_strings) or action.dest}"


def test_every_command_the_readme_names_is_walked() -> None:
    walked = {command for command, _ in ACTIONS}
    readme = {"serve", "tune", "analyze", "stats", "invalidate", "purge", "set-model-version"}
    assert readme | {"engine serve"} <= walked


@pytest.mark.parametrize("item", ACTIONS, ids=[_id(i) for i in ACTIONS])
def test_each_option_has_help_stating_its_default(item: tuple[str, argparse.Action]) -> None:
    _, action = item
    text = action.help or ""
    assert text.strip(), f"{_id(item)} has no help"
    assert text != argparse.SUPPRESS
    takes_value = action.option_strings and action.nargs != 0
    if takes_value and not action.required:
        assert "default" in text.lower(), f"{_id(item)} does not state its default: {text!r}"

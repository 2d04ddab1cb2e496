"""Every subcommand's --help describes each argument and shows an example (a newcomer's first read)."""

from __future__ import annotations

import argparse

import pytest

from stepscope.cli import EXAMPLES, build_parser


def _subparsers() -> dict[str, argparse.ArgumentParser]:
    action = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    return dict(action.choices)


def test_every_subcommand_has_an_example():
    assert set(_subparsers()) == set(EXAMPLES)


@pytest.mark.parametrize("name", sorted(EXAMPLES))
def test_help_describes_every_argument_and_ends_with_the_example(name):
    parser = _subparsers()[name]
    undescribed = [a.dest for a in parser._actions if not a.help]
    assert undescribed == [], f"`stepscope {name}` has arguments with no help: {undescribed}"
    text = parser.format_help()
    assert "example:\n  stepscope " + name in text

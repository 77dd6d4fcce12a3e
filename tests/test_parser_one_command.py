"""``build_parser(words)`` builds only the command a command line names: argparse reads no
other subparser, so its help, its namespace and its errors are those of the whole grammar."""

from __future__ import annotations

import argparse

import pytest

from envlock.commands._parser import build_parser


def _commands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    action = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return dict(action.choices)


FULL = _commands(build_parser())


@pytest.mark.parametrize("command", sorted(FULL))
def test_one_command_s_grammar_is_the_whole_grammar_s(command: str) -> None:
    alone = _commands(build_parser([command, "--anything"]))
    assert list(alone) == [command]
    assert alone[command].format_help() == FULL[command].format_help()


@pytest.mark.parametrize("argv", [
    ["verify", "--python", "py", "--json", "--all", "env.lock"],
    ["capture", "--no-torch", "-o", "x.lock"],
    ["run", "env.lock", "--gpus", "none", "--", "python", "t.py"],
    ["cache", "prune", "--older-than", "3d"],
])
def test_the_namespace_is_the_same(argv: list[str]) -> None:
    assert build_parser(argv).parse_args(argv) == build_parser().parse_args(argv)


@pytest.mark.parametrize("argv", [["verfy", "env.lock"], ["verify", "--deeep", "env.lock"], ["--verison"]])
def test_a_mistyped_line_is_refused_in_the_same_words(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    errors = []
    for parser in (build_parser(argv), build_parser()):
        with pytest.raises(SystemExit):
            parser.parse_args(argv)
        errors.append(capsys.readouterr().err)
    assert errors[0] == errors[1] and "error:" in errors[0]


@pytest.mark.parametrize("words", [[], ["--help"], ["verfy"], ["--version"]])
def test_help_a_typo_or_no_command_gets_every_command(words: list[str]) -> None:
    assert list(_commands(build_parser(words))) == list(FULL) and len(FULL) == 15

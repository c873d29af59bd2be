"""The options dataclass as flags (looplab/arguments.py flag, add_flags, flags_of):
each field's name, type, default and help, written once, is its flag; values are
checked against what argparse would be told by hand."""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from typing import Literal

import pytest

from looplab.arguments import Parser, add_flags, at_least, flag, flags_of


@dataclass(frozen=True)
class Options:
    out: str = flag(help="where it goes")
    steps: int = flag(5, "optimizer steps", type=at_least(1))
    lr: float = flag(0.5, "learning rate (per step)")
    mode: Literal["fast", "slow"] = flag("fast", "how to run")
    dry_run: bool = flag(False, "plan only")
    seeds: tuple[int, ...] = flag((0,), "the seeds", type=lambda t: tuple(int(x) for x in t.split(",")), unset=None)
    tag: list[str] = flag(help="a tag", repeat=True)
    words: list[str] = flag(help="the rest", positional=True)
    not_a_flag: int = 7


def parse(*argv: str) -> tuple[argparse.Namespace, Options]:
    p = Parser(prog="t")
    add_flags(p, Options)
    args = p.parse_args(list(argv))
    return args, flags_of(Options, args)


def test_each_field_reads_from_its_flag_with_its_type():
    _, o = parse(
        "--out",
        "x",
        "--steps",
        "3",
        "--lr",
        "0.25",
        "--mode",
        "slow",
        "--dry-run",
        "--seeds",
        "1,2",
        "--tag",
        "a",
        "--tag",
        "b",
        "w1",
        "w2",
    )
    assert o == Options(
        out="x", steps=3, lr=0.25, mode="slow", dry_run=True, seeds=(1, 2), tag=["a", "b"], words=["w1", "w2"]
    )


def test_left_out_flags_keep_the_field_defaults_or_their_unset():
    args, o = parse("--out", "x")
    assert (o.steps, o.lr, o.mode, o.dry_run, o.tag, o.words, o.not_a_flag) == (5, 0.5, "fast", False, [], [], 7)
    assert args.seeds is None  # unset: the reader supplies the default
    assert flags_of(Options, args, seeds=(3,)).seeds == (3,)


def test_bad_values_are_one_line_naming_the_flag(capsys):
    for argv, said in (
        (["--out", "x", "--steps", "0"], "argument --steps: '0' is invalid; allowed: an integer >= 1"),
        (["--out", "x", "--mode", "quick"], "argument --mode: 'quick' is invalid; allowed: fast | slow (see"),
        (["--out", "x", "--mode", "slwo"], "'slwo' is invalid; allowed: fast | slow (did you mean 'slow'?) (see"),
        (["--out", "x", "--lr", "nan"], "argument --lr: 'nan' is invalid; allowed: a finite number"),
        (["--out", "x", "--lr", "inf"], "argument --lr: 'inf' is invalid; allowed: a finite number"),
        ([], "the following arguments are required: --out"),
        # argparse's own echo of what it did not recognise, escaped: the record separator
        # and an escape sequence would otherwise break the line and redraw the terminal
        (["--out", "x", "--run\x1e", "--\x1b[2J"], "unrecognized arguments: --run\\x1e --\\x1b[2J (see --help)"),
    ):
        with pytest.raises(SystemExit) as stop:
            parse(*argv)
        assert stop.value.code == 2
        err = capsys.readouterr().err
        assert said in err and len(err.strip().splitlines()) == 1, err


def test_help_says_each_default_once():
    p = Parser(prog="t")
    add_flags(p, Options)
    text = " ".join(p.format_help().split())
    assert "learning rate (per step; default 0.5)" in text
    assert "optimizer steps (default 5)" in text
    assert "{fast,slow}" in text and "how to run (default fast)" in text
    assert "plan only (default" not in text  # a switch has no default to say
    assert "--not-a-flag" not in text


@dataclass(frozen=True)
class WithWord:
    store: str = flag(help="the store", argument=True)
    port: int = flag(5000, "the port")
    tags: tuple[str, ...] = flag((), "tags", type=lambda t: tuple(t.split(",")))


def test_a_required_word_is_an_argument_not_a_flag(capsys):
    p = Parser(prog="t")
    add_flags(p, WithWord)
    assert flags_of(WithWord, p.parse_args(["runs/x", "--port", "7"])) == WithWord("runs/x", 7)
    text = " ".join(p.format_help().split())
    assert "STORE the store" in text and "tags (default" not in text  # an empty default is not said
    with pytest.raises(SystemExit):
        p.parse_args(["--port", "7"])
    assert "the following arguments are required: STORE" in capsys.readouterr().err


def test_a_mistyped_name_is_offered_the_nearest(capsys):
    from looplab.errors import allowed_names
    from looplab.presets import get_preset

    assert allowed_names("debgu", ["debug", "local"]) == "debug | local (did you mean 'debug'?)"
    assert allowed_names("zzz", ["debug", "local"]) == "debug | local"  # nothing near: no guess
    with pytest.raises(ValueError, match=r"allowed: .*phop-debug .*\(did you mean 'phop-debug'\?\)$"):
        get_preset("phop-debgu")
    commands = Parser(prog="looplab")
    commands.add_subparsers(dest="command", required=True).add_parser("train")
    with pytest.raises(SystemExit):
        commands.parse_args(["trian"])
    assert (
        "invalid choice: 'trian' (choose from 'train') (did you mean 'train'?) (see --help)" in capsys.readouterr().err
    )

"""`harness --help` is the public face: `tune` first, three examples, and no help text
that names an internal module path (a user writes flags and files, not our modules)."""

from __future__ import annotations

import argparse
import re

from training_harness.cli.main import build_parser

# `training_harness.launch.local` and the like; `harness tune` (a space) is a command, not a path
MODULE_PATH = re.compile(r"\b(training_harness|harness|strategies|reports|kernels)\.[a-z_]+")


def _subparsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    action = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return dict(action.choices)


def test_help_lists_tune_first_with_three_examples():
    parser = build_parser()
    assert next(iter(_subparsers(parser))) == "tune"
    text = parser.format_help()
    listed = re.findall(r"^    (\w+)\s", text.split("COMMAND")[-1].split("examples:")[0], re.M)
    assert listed[0] == "tune", text
    examples = [line.split()[:2] for line in text.split("examples:", 1)[1].splitlines()
                if line.strip()]
    assert len(examples) == 3, text
    assert examples[0] == ["harness", "tune"]
    commands = _subparsers(parser)
    for _, command in examples:  # each example runs a command that exists
        assert command in commands


def test_no_help_text_names_a_module_path():
    parser = build_parser()
    texts = {"harness": parser.format_help()}
    texts |= {name: p.format_help() for name, p in _subparsers(parser).items()}
    named = {name: m.group(0) for name, text in texts.items()
             if (m := MODULE_PATH.search(text))}
    assert not named, named
    assert "tune" in texts and "--launcher" in texts["tune"]  # the help that named one


def test_the_module_path_check_can_fail():
    assert MODULE_PATH.search("a function of training_harness.launch.local.launch's signature")
    assert not MODULE_PATH.search("harness tune --budget 5m; package.module:function")

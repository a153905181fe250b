"""What the fuzz tests (tests/test_fuzz_plans.py, tests/tuner/test_fuzz_studies.py)
ask of every answer to a generated file: exit 0, or exit 2 with one line that names
a key of the file (or the file itself), and how many files each test draws."""

from __future__ import annotations

import contextlib
import io
import os
from pathlib import Path
from typing import Any

from training_harness.cli.main import main, one_line

# The edit-test loop draws a quarter of each test's examples (new ones every run, and
# Hypothesis' example database replays any failure found before); HARNESS_FUZZ_FULL=1
# draws them all (before a release, or after a change to the study or plan checks).
FUZZ_FULL = bool(os.environ.get("HARNESS_FUZZ_FULL"))


def examples(full: int) -> int:
    """A test's number of examples: `full` with HARNESS_FUZZ_FULL=1, else a quarter."""
    return full if FUZZ_FULL else max(full // 4, 20)


def run_cli(argv: list[str]) -> tuple[int, str]:
    """`harness ARGV` in this process: its exit code and its stderr."""
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        code = main(argv)
    return code, err.getvalue()


def all_keys(doc: Any) -> set[str]:
    keys = set()
    if isinstance(doc, dict):
        for k, v in doc.items():
            keys.add(str(k))
            keys |= all_keys(v)
    elif isinstance(doc, list):
        for v in doc:
            keys |= all_keys(v)
    return keys


def assert_exit_0_or_one_line_naming_a_key(code: int, err: str, path: Path, doc: Any,
                                           also: tuple[str, ...] = ()) -> None:
    """`also`: words that count as naming the key (a table's name in a message)."""
    assert code in (0, 2), (code, err)
    if code == 2:
        lines = err.strip().splitlines()
        assert len(lines) == 1 and "Traceback" not in err, err
        named = [str(path)] + sorted(all_keys(doc) if doc else [], key=len, reverse=True)
        assert any(one_line(k) in err for k in named if k.strip()) \
            or any(w in err for w in also), err

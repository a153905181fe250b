"""Fuzzed study files: whatever the file holds, one line and exit 2, or a valid study.

Hypothesis (tests/tuner/study_files_gen.py) writes TOML documents mixing the
study's real keys (top level, and in its tables: workload, layout, budget,
pruning, optimizer, strategies.<name> with search / values / fixed / always,
known_good) with unknown ones, wrong types, unicode, huge and negative numbers,
nan, nested tables; changes the quickstart study in a few places, badly or
nearly validly, so the later checks (strategy settings, layouts, the search
space, the references) are reached too; and writes empty files and binary junk.
`harness tune FILE --check --out DIR` runs every check a run makes and creates
nothing: it must never raise, and exits 0 for a study it accepts, or 2 with one
line that names a key of the file (or the file itself); DIR is never made.
The flags are fuzzed too, on the quickstart study.
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

import tomli_w
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.fuzz_checks import assert_exit_0_or_one_line_naming_a_key, examples, run_cli
from tests.tuner.conftest import write_study
from tests.tuner.study_files_gen import WORDS, documents, edits, mutate, mutations


def run_check(path: Path, out: Path) -> tuple[int, str]:
    return run_cli(["tune", str(path), "--check", "--out", str(out)])


def check(path: Path, doc: dict | None) -> int:
    out = path.parent / "run"
    code, err = run_check(path, out)
    assert not out.exists(), "--check made the run folder"
    assert_exit_0_or_one_line_naming_a_key(code, err, path, doc)
    return code


def write_and_check(doc: dict[str, Any]) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "study.toml"
        try:
            path.write_text(tomli_w.dumps(doc))
        except (TypeError, ValueError):
            return  # not representable as TOML (e.g. a key tomli_w refuses)
        check(path, doc)


FUZZ = settings(deadline=None, suppress_health_check=list(HealthCheck))


@settings(FUZZ, max_examples=examples(500))
@given(doc=documents)
def test_fuzz_study_documents(doc):
    write_and_check(doc)


@settings(FUZZ, max_examples=examples(500))
@given(changes=mutations)
def test_fuzz_mutated_quickstart(changes):
    write_and_check(mutate(changes))


@settings(FUZZ, max_examples=examples(200))  # each passes the checks and goes deeper: 40 ms apiece
@given(changes=edits)
def test_fuzz_nearly_valid_quickstart(changes):
    write_and_check(mutate(changes))


@settings(FUZZ, max_examples=examples(150))
@given(data=st.binary(max_size=64) | st.text(max_size=64).map(str.encode))
def test_fuzz_study_bytes(data):
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "junk.toml"
        path.write_bytes(data)
        check(path, None)


flag_words = st.sampled_from(WORDS) | st.text(max_size=8)
flags = st.fixed_dictionaries({}, optional={
    "--budget": st.sampled_from(["90s", "1h30m", "2d"]) | flag_words,
    "--memory-budget": st.sampled_from(["0.5", "8GiB", "1"]) | flag_words,
    "--n-trials": st.integers(-2, 3) | st.just(10**12),
    "--workers": st.integers(-2, 3) | st.just(10**9),
    "--node-rank": st.integers(-1, 3), "--follow": st.just(True), "--resume": st.just(True),
    "--launcher": st.sampled_from(["tests.tuner.fake_launch:launch", "nowhere.mod:fn", "x",
                                   ":", "os:getcwd", "training_harness.launch.local:nosuch"]),
})
outs = st.sampled_from(["run", "run/a/b", "file", "file/sub", "link/sub", "a\x00b", "x" * 300,
                       "a/" * 2000])


@settings(FUZZ, max_examples=examples(200))
@given(given_flags=flags, out=outs)
def test_fuzz_tune_flags(given_flags, out):
    """The quickstart study with fuzzed flags: one line naming a flag, or a summary."""
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        path = write_study(folder)
        (folder / "file").write_text("a regular file")
        (folder / "link").symlink_to(folder / "nowhere")
        before = sorted(folder.rglob("*"))
        argv = ["tune", str(path), "--check", "--out", str(folder / out)]
        for flag, value in given_flags.items():
            argv += [flag] if value is True else [f"{flag}={value}"]
        code, err = run_cli(argv)
        assert code in (0, 2), (code, err)
        assert sorted(folder.rglob("*")) == before, "--check created something"
        if code == 2:
            assert len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
            assert any(f in err for f in [*given_flags, "--out", "--follow"]), err


def test_fuzz_fixed_examples_binary_junk_and_empty_file(tmp_path):
    cases = {"empty.toml": b"", "junk.toml": b"\xff\xfe\x00\x80name = 1",
             "latin1.toml": 'name = "caf\xe9"'.encode("latin-1"),
             "nul.toml": b'name = "a\x00b"', "spaces.toml": b"   \n\n",
             "deep.toml": b"name = " + b"[" * 5000 + b"]" * 5000,
             "deep-tables.toml": b'name = "x"\nknown_good = ' + b"{a=" * 400 + b"1" + b"}" * 400}
    for file, data in cases.items():
        path = tmp_path / file
        path.write_bytes(data)
        code, err = run_check(path, tmp_path / "run")
        assert code == 2 and len(err.strip().splitlines()) == 1, err
        assert str(path) in err and "Traceback" not in err, err
        assert not (tmp_path / "run").exists()

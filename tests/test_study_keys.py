"""Each study key is documented once, under its dataclass field; docs/tuning.md's key table
is generated from those fields and must not go stale."""

from __future__ import annotations

import ast
import dataclasses
import inspect
import json
import textwrap
from dataclasses import dataclass
from pathlib import Path

import pytest

from training_harness.study.keys import NOT_KEYS, field_docs, section_doc, sections, study_keys
from training_harness.study.keys_doc import BEGIN, COMMAND, END, with_table
from training_harness.study.study_file import Study

TUNING_MD = Path(__file__).resolve().parents[1] / "docs" / "tuning.md"


def test_the_docs_key_table_is_current():
    text = TUNING_MD.read_text()
    assert with_table(text) == text, f"docs/tuning.md's key table is stale: run `{COMMAND}`"


def test_a_stale_table_is_caught():
    text = TUNING_MD.read_text()
    row = next(line for line in text.splitlines() if line.startswith("| `trial_timeout` |"))
    stale = text.replace(row, row[:-1] + "(an old meaning) |")
    assert stale != text and with_table(stale) == with_table(text)  # regenerating mends it
    with pytest.raises(ValueError, match="keys:begin"):
        with_table(text.replace(BEGIN, ""))
    with pytest.raises(ValueError):
        with_table(END + text.replace(END, ""))  # the end before the beginning


def test_every_key_and_section_has_its_meaning():
    keys = study_keys()
    assert [k.path for k in keys if not k.doc] == []
    assert [name for name, cls in sections() if not section_doc(cls)] == []
    listed = {(k.section, k.name) for k in keys}
    tables = {name.split(".")[0] for name, _ in sections() if name}
    for name, cls in sections():  # every field a user writes is listed, nothing else
        fields = {f.name for f in dataclasses.fields(cls)} - NOT_KEYS - (set() if name else tables)
        assert {n for s, n in listed if s == name} == fields, name
    assert len(keys) == len(listed) > 50
    assert {"layout", "budget", "pruning", "storage", "optimizer", "cluster", "target"} < tables


def test_keys_are_described_in_docstrings_not_comments():
    """A comment beside a field would be a second description (or the only one)."""
    for _, cls in sections():
        source = textwrap.dedent(inspect.getsource(cls))
        lines = source.splitlines()
        for node in ast.parse(source).body[0].body:
            if isinstance(node, ast.AnnAssign):
                line = lines[node.lineno - 1]
                assert "  # " not in line, f"{cls.__name__}: {line.strip()}"


@pytest.mark.parametrize("key", study_keys(), ids=lambda k: k.path)
def test_each_listed_default_is_the_parsers(key):
    """The default printed is a value the key takes, and the one the parser fills in."""
    if key.default.startswith("("):
        assert key.default in ("(required)", "(unset)")
        return
    value = json.loads(key.default)
    base: dict = {"name": "t"}
    if key.section:
        root = key.section.split(".")[0]
        base[root] = {"amp": {}} if key.section.endswith("<name>") else {}
    given = json.loads(json.dumps(base))
    table = given[key.section.split(".")[0]] if key.section else given
    (table["amp"] if key.section.endswith("<name>") else table)[key.name] = value
    assert Study.from_dict(given) == Study.from_dict(base)


def test_types_defaults_and_bounds_read_as_written():
    keys = {k.path: k for k in study_keys()}
    assert (keys["name"].type, keys["name"].default) == ("str", "(required)")
    assert (keys["budget.time"].type, keys["budget.time"].default) == ("str | float", '"1h"')
    assert keys["seed"].type == "int in [0, 2^32-1]"
    assert keys["steps"].type == "int in [1, 1e6]"
    assert keys["micro_batch_sizes"].type == "list[int] | {min, max}"
    assert keys["device"].type == '"auto" | "cpu" | "cuda"'
    assert keys["cluster.partition"].default == "(unset)"
    assert keys["strategies.<name>.always"].default == "false"
    assert "workload_args" not in keys and "budget" not in keys


def test_field_docs_reads_the_string_under_each_field():
    @dataclass
    class Example:
        a: int = 1
        """First line,
        folded."""
        b: int = 2  # a comment is not a docstring
        c: str = "x"
        "single-quoted counts too"

    assert field_docs(Example) == {"a": "First line, folded.", "c": "single-quoted counts too"}
    assert section_doc(Example) == ""  # dataclass's made-up signature is no meaning

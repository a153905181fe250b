"""Fuzzed plan files: whatever the file holds, one line and exit 2, or a valid plan.

Hypothesis writes TOML documents mixing the plan's real keys with unknown ones,
wrong types, unicode, huge and negative numbers, nested tables, empty files and
binary junk. `harness estimate` (which checks everything `bench` checks, and
runs nothing) must never raise: it exits 0 for a plan it accepts, or 2 with one
line that names a key of the file (or the file itself).
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import tomli_w
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.fuzz_checks import assert_exit_0_or_one_line_naming_a_key, examples, run_cli

KEYS = ["name", "device", "micro_batch_size", "global_batch_size", "warmup_steps", "steps",
        "seed", "timeout_s", "workload", "layout", "strategies", "optimizer"]
SUB_KEYS = ["name", "layers", "heads", "hidden", "seq_len", "vocab", "data", "pipeline",
            "tensor", "amp", "dtype", "checkpoint", "every", "fused", "lamb", "zero", "stage",
            "lr", "betas", "attention"]
WORKLOADS = ["gpt", "mlp", "vit", "resnet", "nosuch", "os:system", "tests.user_workload:build"]

scalars = st.one_of(
    st.integers(min_value=-(2**63), max_value=2**63 - 1),
    st.sampled_from([0, 1, -1, 2, 3, 8, 2**31, 10**18]),
    st.floats(allow_nan=False, allow_infinity=True),
    st.booleans(),
    st.text(max_size=12),
    st.sampled_from(["bf16", "fp16", "cpu", "cuda", "auto", "sdpa", "gpt", "√∂∫", "<script>"]),
)
values = st.recursive(
    scalars,
    lambda inner: st.one_of(
        st.lists(inner, max_size=3),
        st.dictionaries(st.sampled_from(SUB_KEYS) | st.text(max_size=6), inner, max_size=3),
    ),
    max_leaves=6,
)
workload_tables = st.fixed_dictionaries(
    {"name": st.sampled_from(WORKLOADS)},
    optional={k: st.sampled_from([1, 2, 4, 0, -3, 10**9, "x", 2.5]) for k in SUB_KEYS[1:6]},
)
documents = st.dictionaries(
    st.sampled_from(KEYS) | st.text(min_size=1, max_size=8),
    values | workload_tables,
    max_size=6,
)


def run_estimate(path: Path) -> tuple[int, str]:
    return run_cli(["estimate", str(path)])


def check(path: Path, doc: dict | None) -> None:
    code, err = run_estimate(path)
    assert_exit_0_or_one_line_naming_a_key(code, err, path, doc, also=("strateg", "workload"))


@settings(max_examples=examples(400), deadline=None, suppress_health_check=list(HealthCheck))
@given(doc=documents)
def test_fuzz_plan_documents(doc):
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "plan.toml"
        try:
            path.write_text(tomli_w.dumps(doc))
        except (TypeError, ValueError):
            return  # not representable as TOML (e.g. a key tomli_w refuses)
        check(path, doc)


@settings(max_examples=examples(100), deadline=None, suppress_health_check=list(HealthCheck))
@given(data=st.binary(max_size=64) | st.text(max_size=64).map(str.encode))
def test_fuzz_plan_bytes(data):
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "junk.toml"
        path.write_bytes(data)
        check(path, None)


def test_fuzz_empty_plan_is_the_default_plan(tmp_path):
    path = tmp_path / "empty.toml"
    path.write_text("")
    assert run_estimate(path)[0] == 0

"""Hypothesis strategies for study files (tests/tuner/test_fuzz_studies.py).

    documents   the study's keys (and now and then unknown ones) with values of
                every kind: wrong types, unicode, huge, negative, nan, nested
    mutations   the quickstart study changed in one to four places, often badly
    edits       the quickstart study changed in one to three places with values
                near valid ones, so most pass and the search space, the layouts
                and the references are checked on many shapes of study
"""

from __future__ import annotations

from typing import Any

from hypothesis import strategies as st

from tests.tuner.conftest import study_table

TABLES = {
    "workload": ["name", "layers", "heads", "hidden", "seq_len", "vocab", "ffn_mult",
                 "dropout", "attention", "tie_weights"],
    "layout": ["world_sizes", "pipeline", "tensor", "nnodes"],
    "budget": ["time", "memory", "trial_timeout", "n_trials", "ablation_share",
               "ablation_repeats"],
    "pruning": ["slower_than", "min_steps"],
    "optimizer": ["lr", "weight_decay", "betas", "eps"],
    "micro_batch_sizes": ["min", "max"],
    "known_good": ["micro_batch_size", "layout", "strategies"],
}
KEYS = ["name", "device", "objective", "sampler", "seed", "global_batch_size",
        "micro_batch_sizes", "warmup_steps", "steps", "strategies", *TABLES]
WORKLOADS = ["gpt", "gpt", "mlp", "vit", "resnet", "nosuch", "tests.user_workload:build",
             "harness.nosuch:build", "os:getcwd"]
STRATEGIES = ["amp", "fused", "checkpoint", "lamb", "ddp", "zero", "pipeline", "tensor",
              "accumulation", "turbo"]
SETTINGS = ["dtype", "init_scale", "attention", "optimizer", "compile", "layernorm", "every",
            "stage", "offload", "bucket_cap_mb", "compression", "schedule", "virtual_stages",
            "mlp", "max_grad_norm", "speed"]
WORDS = ["bf16", "fp16", "cpu", "cuda", "auto", "grid", "tpe", "nsga2", "throughput", "memory",
         "sdpa", "fused", "gpt", "mlp", "nosuch", "tests.user_workload:build", "3m", "-5m", "0s",
         "1d", "1h30m", "9" * 400 + "s", "70GiB", "0.9", "1e999", "inf", "nan", "", " ",
         "a/b", ".x", "√∂∫", "名前", "<script>", "\x00", "\n", "\x1b[2J"]

scalars = st.one_of(
    st.integers(min_value=-(2**63), max_value=2**63 - 1),
    st.sampled_from([0, 1, -1, 2, 3, 4, 8, 16, 2**31, 2**32, 2**62, 10**18]),
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from([0.0, 0.5, 0.9, 1.0, 1.5, -0.1, 1e-300, 1e300]),
    st.booleans(),
    st.text(max_size=12),
    st.sampled_from(WORDS),
)
names = st.sampled_from(KEYS + STRATEGIES + SETTINGS + ["low", "high", "log", "search",
                                                        "values", "fixed", "always"])
values = st.recursive(
    scalars,
    lambda inner: st.one_of(
        st.lists(inner, max_size=3),
        st.dictionaries(names | st.text(max_size=6), inner, max_size=3),
    ),
    max_leaves=6,
)
# Values close to valid ones, so the checks after types and bounds are reached.
plausible = st.one_of(
    st.integers(min_value=-2, max_value=64),
    st.sampled_from(WORDS + [0.25, 0.9, 2.5, True, False, 1e6, 2**20, 2**40]),
    st.lists(st.integers(min_value=-1, max_value=16) | st.sampled_from(WORDS[:12]),
             max_size=4),
    st.fixed_dictionaries({"min": st.integers(-1, 64), "max": st.integers(-1, 2**25)}),
    st.fixed_dictionaries({}, optional={"data": st.integers(0, 4), "pipeline": st.integers(0, 4),
                                        "tensor": st.integers(0, 4)}),
)
setting_values = st.one_of(
    st.lists(scalars | plausible, min_size=0, max_size=3),
    st.fixed_dictionaries({"low": scalars | plausible, "high": scalars | plausible},
                          optional={"log": st.booleans() | scalars}),
    values,
)


def keys_of(known: list[str]) -> st.SearchStrategy[str]:
    """Mostly the real keys, sometimes any text."""
    real = st.sampled_from(known)
    return st.one_of(real, real, real, st.text(min_size=1, max_size=6))


strategy_tables = st.fixed_dictionaries({}, optional={
    "search": st.lists(keys_of(SETTINGS), max_size=3) | values,
    "values": st.dictionaries(st.sampled_from(SETTINGS), setting_values, max_size=2) | values,
    "fixed": st.dictionaries(st.sampled_from(SETTINGS), scalars | plausible, max_size=2)
    | values,
    "always": st.booleans() | values,
})
known_good = st.fixed_dictionaries({}, optional={
    "micro_batch_size": plausible, "layout": plausible | values,
    "strategies": st.dictionaries(keys_of(STRATEGIES),
                                  st.dictionaries(keys_of(SETTINGS), plausible) | plausible,
                                  max_size=2) | plausible,
})
tables = {name: st.dictionaries(keys_of(keys), values | plausible, max_size=4)
          for name, keys in TABLES.items()}
tables["workload"] |= st.fixed_dictionaries(
    {"name": st.sampled_from(WORKLOADS)},
    optional={k: plausible for k in TABLES["workload"][1:]})
tables["strategies"] = st.dictionaries(keys_of(STRATEGIES), strategy_tables | values,
                                       max_size=3)
tables["known_good"] |= known_good
# Documents: mostly the study's keys, each with values of every kind (its own table's
# keys for a table), and now and then unknown keys; the name is usually good.
documents = st.tuples(
    st.fixed_dictionaries(
        {"name": st.one_of(st.just("fuzz"), st.just("fuzz"), st.just("fuzz"), scalars,
                           st.sampled_from([".x", "a b", "", "名前", "a\x00b", "-\n-"]))},
        optional={k: st.one_of(plausible, values, tables.get(k, values)) for k in KEYS[1:]}),
    st.dictionaries(st.text(min_size=1, max_size=8), values, max_size=1),
).map(lambda pair: {**pair[1], **pair[0]})
# Mutations of the quickstart study: (table or None, key, new value or None to drop it),
# or ("values", setting, values) narrowing a setting of the strategy that has it.
new_value = st.one_of(plausible, plausible, values, st.none())
mutations = st.lists(st.one_of(
    st.tuples(st.none(), keys_of(KEYS), new_value),
    *(st.tuples(st.just(name), keys_of(keys), new_value) for name, keys in TABLES.items()),
    st.tuples(st.just("strategies"), keys_of(STRATEGIES), strategy_tables | st.none()),
    st.tuples(st.just("values"), st.sampled_from(SETTINGS), setting_values),
    st.tuples(st.none(), st.just("known_good"), known_good),
), min_size=1, max_size=4)
OWNER = {"dtype": "amp", "init_scale": "amp", "attention": "fused", "optimizer": "fused",
         "compile": "fused", "layernorm": "fused", "every": "checkpoint", "stage": "zero",
         "offload": "zero", "bucket_cap_mb": "ddp", "compression": "ddp",
         "schedule": "pipeline", "virtual_stages": "pipeline", "mlp": "tensor",
         "max_grad_norm": "lamb"}


def mutate(changes: list[tuple[str | None, str, Any]]) -> dict[str, Any]:
    doc = study_table(strategies={"checkpoint": {}})
    for table, key, value in changes:
        if table is not None and not isinstance(doc.get(table), dict):
            doc[table] = {}
        if table == "values":  # narrow `key` of the strategy that has it (searched)
            doc.pop("values")
            listed = doc.setdefault("strategies", {})
            if not isinstance(listed, dict):
                continue
            spec = listed.setdefault(OWNER.get(key, "amp"), {})
            if isinstance(spec, dict):
                spec["search"] = [key]
                spec["values"] = {key: value}
            continue
        target = doc if table is None else doc[table]
        if value is None:
            target.pop(key, None)
        else:
            target[key] = value
    return doc


# --- edits: values near valid ones ------------------------------------------------
SETTING_VALUES = {
    "amp": {"dtype": ["bf16", "fp16"], "init_scale": [1024.0, 65536.0]},
    "fused": {"attention": ["sdpa", "explicit"], "optimizer": ["default", "foreach", "fused",
                                                               "triton"],
              "compile": [False, True], "layernorm": ["eager", "compile", "triton"]},
    "checkpoint": {"every": [1, 2, 4]},
    "lamb": {"max_grad_norm": [0.0, 0.5, 1.0]},
    "ddp": {"bucket_cap_mb": [5.0, 25.0], "compression": ["none", "fp16", "bf16"]},
    "zero": {"stage": [1, 2, 3], "offload": [False, True]},
    "pipeline": {"schedule": ["gpipe", "1f1b", "interleaved-1f1b"], "virtual_stages": [1, 2]},
    "tensor": {"mlp": [True, False]},
}
NUMERIC = {"init_scale", "every", "max_grad_norm", "bucket_cap_mb", "stage", "virtual_stages"}


@st.composite
def near_strategy(draw: Any, name: str) -> dict[str, Any]:
    """A table for strategy `name` as a user would write it: searched settings, their
    values (a few of the real ones, or a range), the others maybe fixed."""
    own = SETTING_VALUES[name]
    searched = draw(st.lists(st.sampled_from(sorted(own)), unique=True, max_size=len(own)))
    table: dict[str, Any] = {}
    if draw(st.booleans()):
        table["search"] = searched
    for key in searched:
        if key in NUMERIC and draw(st.booleans()):
            low, high = sorted(draw(st.lists(st.sampled_from(own[key] + [0, 8]), min_size=2,
                                             max_size=2)))
            table.setdefault("values", {})[key] = {"low": low, "high": high,
                                                   "log": draw(st.booleans())}
        elif draw(st.booleans()):
            table.setdefault("values", {})[key] = draw(
                st.lists(st.sampled_from(own[key]), min_size=1, max_size=3))
    for key in sorted(set(own) - set(searched)):
        if draw(st.booleans()):
            table.setdefault("fixed", {})[key] = draw(st.sampled_from(own[key]))
    if draw(st.booleans()):
        table["always"] = draw(st.booleans())
    return table


near = {
    (None, "global_batch_size"): st.sampled_from([1, 2, 6, 8, 16, 32, 64, 96, 2**30]),
    (None, "micro_batch_sizes"): st.lists(st.sampled_from([1, 2, 3, 4, 8, 16, 32]),
                                          min_size=1, max_size=4)
    | st.builds(dict, min=st.sampled_from([1, 2, 4]), max=st.sampled_from([2, 16, 2**24])),
    (None, "objective"): st.sampled_from(["throughput", "memory", ["throughput", "memory"],
                                          ["memory", "throughput"], ["memory", "memory"]]),
    (None, "sampler"): st.sampled_from(["auto", "tpe", "nsga2", "random", "grid"]),
    (None, "seed"): st.sampled_from([0, 1, 2**32 - 1]),
    (None, "device"): st.sampled_from(["auto", "cpu"]),
    (None, "warmup_steps"): st.integers(0, 3),
    (None, "steps"): st.integers(1, 8),
    ("layout", "world_sizes"): st.lists(st.sampled_from([1, 2, 4, 8]), min_size=1, max_size=3),
    ("layout", "pipeline"): st.lists(st.sampled_from([1, 2]), min_size=1, max_size=2),
    ("layout", "tensor"): st.lists(st.sampled_from([1, 2, 4]), min_size=1, max_size=2),
    ("layout", "nnodes"): st.sampled_from([1, 2]),
    ("budget", "time"): st.sampled_from(["90s", "1h", "1d", 60, 0.5, "3650d"]),
    ("budget", "memory"): st.sampled_from([0.5, 1, "8GiB", 2**30, "1B"]),
    ("budget", "n_trials"): st.sampled_from([0, 1, 5]),
    ("budget", "ablation_share"): st.sampled_from([0.0, 0.5, 0.95]),
    ("pruning", "slower_than"): st.sampled_from([0.0, 1.0, 3.0]),
    ("workload", "layers"): st.integers(1, 4),
    ("workload", "heads"): st.sampled_from([1, 2, 3, 4]),
    ("workload", "name"): st.sampled_from(["gpt", "mlp", "vit"]),
    ("workload", "tie_weights"): st.booleans(),
    ("known_good", "micro_batch_size"): st.sampled_from([4, 8, 16, 3]),
    ("known_good", "layout"): st.builds(dict, data=st.integers(1, 2),
                                        pipeline=st.integers(1, 2), tensor=st.integers(1, 2)),
    ("known_good", "strategies"): st.sampled_from(["amp", "fused", "checkpoint", "lamb"]).flatmap(
        lambda name: st.fixed_dictionaries({name: st.fixed_dictionaries({}, optional={
            k: st.sampled_from(v) for k, v in SETTING_VALUES[name].items()})})),
    **{("strategies", name): near_strategy(name) for name in SETTING_VALUES},
}
edits = st.lists(st.sampled_from(sorted(near, key=str)).flatmap(
    lambda where: st.tuples(st.just(where[0]), st.just(where[1]), near[where])),
    min_size=1, max_size=3)


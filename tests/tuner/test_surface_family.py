"""The surface family (tests/benchmarks/surfaces/family.py): the base surfaces unchanged by
the refactor that made their figures overridable, every member deterministic, each named
surface different from the base in its stated factor and direction only, and the family
report's goals (tests/benchmarks/surface_replay/family_report.py)."""

from __future__ import annotations

import dataclasses
import json

import pytest

from tests.benchmarks.surface_replay.family_report import (
    arms_of,
    judge,
    judge_samplers,
    load,
    samplers_section,
)
from tests.benchmarks.surface_replay.family_run import done_in
from tests.benchmarks.surfaces.assumptions import BASE
from tests.benchmarks.surfaces.family import (
    DRAWN,
    NAMED,
    SPACES,
    draw,
    members,
    surface,
)
from tests.benchmarks.surfaces.gpt_memory import memory
from tests.benchmarks.surfaces.h100 import (
    EIGHT_GPUS,
    ONE_GPU,
    gpt2_small_1gpu,
    gpt_1b_8gpu,
    make_surface,
)
from tests.tuner.test_surface_replay import GPT1B, plan

COMPILED = plan(16, {"amp": {"dtype": "bf16"},
                     "fused": {"attention": "sdpa", "optimizer": "fused", "compile": True}})
EAGER_CK = plan(4, {"amp": {"dtype": "fp16"}, "checkpoint": {"every": 2}, "lamb": {}})
EAGER = plan(2, {"amp": {"dtype": "bf16"}, "fused": {"attention": "sdpa", "optimizer": "fused"}})
ZERO3 = plan(2, {"amp": {"dtype": "bf16"}, "zero": {"stage": 3}}, GPT1B, 256, data=8)
HYBRID = plan(2, {"amp": {"dtype": "bf16"}, "checkpoint": {"every": 1}, "ddp": {}, "tensor": {},
                  "pipeline": {"schedule": "1f1b"}}, GPT1B, 256, data=2, pipeline=2, tensor=2)

# (truth status, samples/s, peak bytes; repeat 3's samples/s, wall_s, peak bytes) of the two
# H100 surfaces before their figures became an Assumptions object (commit 06ced39)
BEFORE = [
    (gpt2_small_1gpu, COMPILED, ("ok", 384.82642537200786, 21974202081, 375.7423724872163,
                                 81.20175002221302, 22004554054)),
    (gpt2_small_1gpu, EAGER_CK, ("ok", 135.445606792867, 10747596840, 134.50956820354196,
                                 23.980291742678418, 10872478304)),
    (gpt_1b_8gpu, ZERO3, ("ok", 108.00545608086468, 46468130457, 106.37796059058516,
                          91.82989725900754, 46445539371)),
    (gpt_1b_8gpu, HYBRID, ("ok", 60.90710892187046, 15853227868, 58.76294514771527,
                           142.17562358812182, 15706040298)),
]


def figures(fn, p):
    t, r = fn.truth(p), fn(p, 3)
    return (t["status"], t["samples_per_s"], t["peak_memory_bytes"], r["samples_per_s"],
            r["wall_s"], r["peak_memory_bytes"])


def test_the_base_surfaces_give_the_same_figures_as_before():
    for fn, p, before in BEFORE:
        assert figures(fn, p) == before
        base = members("gpt-1b-8gpu" if fn is gpt_1b_8gpu else "gpt2-small-1gpu", drawn=0)[0]
        assert base.__name__ == "base" and fn(p, 3) == base(p, 3)


def test_the_family_and_its_members():
    eight, one = members("gpt-1b-8gpu"), members("gpt2-small-1gpu")
    assert len(eight) + len(one) >= 20
    assert len(eight) == 1 + len(NAMED) + DRAWN["gpt-1b-8gpu"]
    assert {"comm-slow", "comm-fast", "comm-pcie"} & {s.__name__ for s in one} == set()
    for s in eight + one:
        assert s.__name__ and s.__doc__ and "\n" not in s.__doc__
        assert s(ZERO3 if s in eight else EAGER_CK, 2) == s(ZERO3 if s in eight else EAGER_CK, 2)
    # a drawn surface is a function of (space, index) alone, and differs from the base
    a, line = draw("gpt-1b-8gpu", 3)
    assert draw("gpt-1b-8gpu", 3) == (a, line) and a != BASE and "drawn #3" in line
    assert surface("gpt-1b-8gpu", "drawn-3").assumptions == a
    assert draw("gpt2-small-1gpu", 3)[0] != a
    for space in SPACES:
        for i in range(DRAWN[space]):
            d = draw(space, i)[0]
            assert 15e9 <= d.busbw <= 450e9 and 0.5 <= d.recompute <= 2.0
            assert 0.2 <= d.compile_elementwise <= 0.9 and 0.7 <= d.activations <= 1.5


def step(space: str, name: str, p: dict) -> float:
    return surface(space, name).truth(p)["step_time_s"]


def test_communication_surfaces_change_only_multi_gpu_plans():
    def ratio(name: str, p: dict) -> float:
        return step("gpt-1b-8gpu", name, p) / step("gpt-1b-8gpu", "base", p)

    # ZeRO-3's gathers hide mostly under 16 micro-batches of compute: 2.5x moves it little;
    # tensor parallel's all-reduces are on the critical path
    assert ratio("comm-slow", ZERO3) > 1.0 > ratio("comm-fast", ZERO3)
    assert ratio("comm-slow", HYBRID) > 1.1 and ratio("comm-fast", HYBRID) < 0.97
    assert ratio("comm-pcie", ZERO3) > 1.3 and ratio("comm-pcie", HYBRID) > 1.3
    # the same assumptions on one GPU: nothing to communicate, nothing changes
    for name in ("comm-slow", "comm-pcie"):
        one = make_surface(ONE_GPU, dataclasses.replace(BASE, **NAMED[name][0]), "x", "x")
        for p in (COMPILED, EAGER_CK):
            assert one.truth(p)["step_time_s"] == gpt2_small_1gpu.truth(p)["step_time_s"]


ZERO2_COMPILED = plan(4, {"amp": {"dtype": "bf16"}, "zero": {"stage": 2},
                         "fused": {"attention": "sdpa", "optimizer": "fused", "compile": True}},
                    GPT1B, 256, data=8)
ZERO2_CK = plan(4, {"amp": {"dtype": "bf16"}, "zero": {"stage": 2}, "checkpoint": {"every": 1}},
                GPT1B, 256, data=8)
# per space: (checkpointed, not checkpointed, eager, compiled) plans
PLANS = {"gpt2-small-1gpu": (EAGER_CK, COMPILED, EAGER, COMPILED),
         "gpt-1b-8gpu": (ZERO2_CK, ZERO3, ZERO3, ZERO2_COMPILED)}


@pytest.mark.parametrize("space", list(SPACES))
def test_each_named_surface_moves_its_factor_only(space):
    ck, plain, eager, compiled = PLANS[space]

    def ratio(name: str, p: dict) -> float:
        return step(space, name, p) / step(space, "base", p)

    assert ratio("recompute-heavy", ck) > 1.05 and ratio("recompute-cheap", ck) < 0.97
    assert ratio("recompute-heavy", plain) == ratio("recompute-cheap", plain) == 1.0
    assert ratio("launch-slow", eager) > 1.0 > ratio("launch-fast", eager)
    if space == "gpt2-small-1gpu":  # micro-batch 2 is launch-bound; a compiled block
        assert ratio("launch-slow", eager) > 1.3  # issues no eager ops
        assert ratio("launch-slow", compiled) == ratio("launch-fast", compiled) == 1.0
    assert ratio("compile-weak", compiled) > 1.05 and ratio("compile-strong", compiled) < 0.97
    assert ratio("compile-weak", eager) == ratio("compile-strong", eager) == 1.0
    for name in ("memory-high", "memory-low"):  # memory: the same speed
        assert ratio(name, plain) == ratio(name, ck) == 1.0


def test_memory_surfaces_move_the_peak_both_ways():
    node = {"gpt-1b-8gpu": EIGHT_GPUS, "gpt2-small-1gpu": ONE_GPU}
    big = plan(32, {"amp": {"dtype": "bf16"}, "fused": {"attention": "sdpa"}})
    for p, space in ((big, "gpt2-small-1gpu"), (ZERO3, "gpt-1b-8gpu")):
        peaks = {n: surface(space, n).truth(p)["peak_memory_bytes"]
                 for n in ("base", "memory-high", "memory-low")}
        assert peaks["memory-low"] < peaks["base"] < peaks["memory-high"]
        assert node[space] is surface(space, "base").node
    # bf16 with eager attention: micro-batch 32 fits the base and not twice the activations;
    # 64 does not fit the base and fits half of them
    status = {(micro, n): surface("gpt2-small-1gpu", n).truth(
        plan(micro, {"amp": {"dtype": "bf16"}}))["status"]
        for micro in (32, 64) for n in ("base", "memory-high", "memory-low")}
    assert (status[32, "base"], status[32, "memory-high"]) == ("ok", "oom")
    assert (status[64, "base"], status[64, "memory-low"]) == ("oom", "ok")
    assert memory.__defaults__ == (BASE,)


def _line(surface_name: str, harness: list[float | None], random: list[float],
          share: float) -> dict:
    runs = {"harness": [{"seed": i, "reached_s": c, "share_1h": share, "launched": 10,
                         "stopped": "time: x" if c is None else "replay: goal",
                         "elapsed_s": 72000.0} for i, c in enumerate(harness)],
            "random": [{"seed": i, "reached_s": c, "share_1h": 0.7, "launched": 90}
                       for i, c in enumerate(random)],
            "estimator": [{"seed": i, "reached_s": None, "launched": 5}
                          for i in range(len(harness))]}
    return {"space": "gpt-1b-8gpu", "surface": surface_name, "assumes": "x",
            "seeds": len(harness), "configurations": 7000, "statuses": {}, "best": 1.0,
            "near": 3, "budget_s": 86400.0, "budget_bytes": 1, "tree": "t", "wall_s": 1.0,
            "cpu_s": 1.0, "runs": runs}


def test_the_report_checks_the_three_goals(tmp_path):
    good = judge(_line("good", [3600.0, 7200.0, 3600.0], [36000.0] * 3, 0.96))
    assert good["goal_miss"] and good["goal_1h"] and good["goal_ratio"]
    assert good["median"] == 3600.0 and good["worst"] == 7200.0 and good["ratio"] == 0.1
    bad = judge(_line("bad", [3600.0, None, 36000.0], [36000.0] * 3, 0.94))
    assert bad["misses"] == 1 and not bad["goal_miss"] and not bad["goal_1h"]
    assert not bad["goal_ratio"] and bad["worst"] == float("inf")
    assert bad["miss_stops"] == {"time": 1}
    out = tmp_path / "f.jsonl"
    out.write_text(json.dumps(_line("good", [1.0], [2.0], 1.0)) + "\n")
    assert done_in(out) == {("gpt-1b-8gpu", "good", 1)}
    assert [r["surface"] for r in load([out, out])] == ["good"]


def test_the_harness_against_optuna_s_samplers(tmp_path):
    """A sampler replayed with fewer seeds in a line of its own joins the harness's; the
    best sampler is the one of lowest median; 1/2 of its median and no miss are the goals."""
    three = _line("base", [3600.0, 7200.0, 3600.0], [36000.0] * 3, 0.96)
    three["runs"]["tpe"] = [{"seed": i, "reached_s": c} for i, c in
                            enumerate([36000.0, None, 9000.0])]
    one = _line("base", [3600.0], [36000.0], 0.96)
    one["runs"]["gp"] = [{"seed": 0, "reached_s": 5400.0}]
    arms = arms_of([three, one])[("gpt-1b-8gpu", "base")]
    assert len(arms["harness"]) == 3 and len(arms["gp"]) == 1
    j = judge_samplers("base", arms)
    assert j["best"] == "gp" and j["figures"]["tpe"]["misses"] == 1
    assert j["figures"]["tpe"]["p90"] == float("inf") and j["ratio"] == 3600.0 / 5400.0
    assert not j["goal_half"] and j["goal_miss"]
    text = "\n".join(samplers_section([three, one]))
    assert "| base | 1.00, 2.00, 0 of 3 | 10.00, missed, 1 of 3 | 1.50, 1.50, 0 of 1 |" in text
    assert "Goals met: 1/2 of the best sampler on 0 of 1 surfaces" in text
    assert judge_samplers("base", {"harness": arms["harness"]}) is None
    # two files of the same seeds, one sampler each: the report holds both
    gp_runs = {k: v for k, v in three["runs"].items() if k != "tpe"} | {"gp": arms["gp"] * 3}
    (tmp_path / "tpe.jsonl").write_text(json.dumps(three) + "\n")
    (tmp_path / "gp.jsonl").write_text(json.dumps({**three, "runs": gp_runs}) + "\n")
    merged = load([tmp_path / "tpe.jsonl", tmp_path / "gp.jsonl"])
    assert len(merged) == 1 and {"tpe", "gp"} <= merged[0]["runs"].keys()
    # a run censored at 3 h costs more than 3 h: judged against that lower bound
    one["runs"]["gp"] = [{"seed": 0, "reached_s": None, "censored_s": 10800.0}]
    j = judge_samplers("base", arms_of([three, one])[("gpt-1b-8gpu", "base")])
    assert j["best"] == "gp" and j["figures"]["gp"]["misses"] == 0 and j["goal_half"]
    assert "| > 3.00, > 3.00, 0 of 1, 1 censored | GPSampler | < 0.33 |" in "\n".join(
        samplers_section([three, one]))

"""liger: Liger Kernel's patches on hf: Llama-family models. Its claims on the CPU:

- each refusal is one line (the CPU, a model type Liger has no Llama-family patch for,
  no liger-kernel installed, tensor parallel, the pipeline, two losses at once);
- it patches exactly the parts asked (the RMSNorm and MLP instances' forwards, the
  rotary function, the model's forward), on a tiny hf:llama built on the CPU;
- numerics, in Triton's interpreter (a subprocess with TRITON_INTERPRET=1, set before
  triton is imported): with RoPE and fused linear cross-entropy, three AdamW steps'
  losses within 1e-5 of the unpatched model's (observed: equal) and the first step's
  gradients within 1e-5 (observed <= 3e-8), while the head's matmul never runs (no
  logits). Liger's RMSNorm and SwiGLU kernels do not run in the interpreter (their
  skip says why); on a GPU the whole set is compared (marked gpu).
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import textwrap

import pytest
import torch

# Looked up, not imported: liger_kernel imports triton, and tests/kernels/conftest.py must
# be the first to import it in a worker (in interpreter mode, on the CPU).
pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("transformers") is None
    or importlib.util.find_spec("liger_kernel") is None,
    reason="needs the [hf] and [liger] extras")

from training_harness.core.device import RuntimeEnv  # noqa: E402
from training_harness.core.plan import Layout, Plan  # noqa: E402
from training_harness.strategies.base import Phase  # noqa: E402
from training_harness.strategies.registry import get  # noqa: E402
from training_harness.strategies.setup import Setup  # noqa: E402
from training_harness.workloads import load_workload  # noqa: E402

LLAMA = {"num_hidden_layers": 2, "hidden_size": 32, "intermediate_size": 64,
         "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 64,
         "max_position_embeddings": 64, "seq_len": 16}
CPU = RuntimeEnv.detect("cpu")
GPU = RuntimeEnv("cuda", "an H100 (described)", 1, True, True)  # checks only: nothing runs
OFF = {"rope": False, "rms_norm": False, "swiglu": False, "fused_linear_cross_entropy": False}


def plan(strategies: dict, workload: str = "hf:llama", args: dict | None = None,
         **kw) -> Plan:
    return Plan(workload=workload, workload_args=LLAMA if args is None else args,
                micro_batch_size=2, global_batch_size=2, strategies=strategies,
                device="cuda", **kw)


def reasons(p: Plan, env: RuntimeEnv = GPU) -> list[str]:
    liger = get("liger")
    return liger.check(liger.parse(p.strategies["liger"]), p, env)


def only(p: Plan, env: RuntimeEnv = GPU) -> str:
    found = reasons(p, env)
    assert len(found) == 1, found
    assert "\n" not in found[0]
    return found[0]


def test_a_llama_on_a_gpu_passes():
    assert reasons(plan({"liger": {}})) == []


def test_refused_on_the_cpu():
    assert "Triton for CUDA GPUs; cpu has none" in only(plan({"liger": {}}), CPU)


@pytest.mark.parametrize("workload, args, said", [
    ("hf:gpt2", {"n_layer": 1, "n_embd": 32, "n_head": 2, "vocab_size": 64, "seq_len": 16},
     "model type 'gpt2'"),
    ("hf:gemma", {**LLAMA, "head_dim": 8}, "model type 'gemma'"),  # GeGLU: no swiglu patch
    ("gpt", {"layers": 1, "heads": 2, "hidden": 32, "seq_len": 16, "vocab": 64},
     "'gpt' is not one"),
])
def test_unsupported_models_are_refused(workload, args, said):
    line = only(plan({"liger": {}}, workload, args))
    assert said in line and "drop [strategies.liger]" in line


def test_without_the_package_it_says_which_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "liger_kernel", None)  # import liger_kernel fails
    line = only(plan({"liger": {}}))
    assert "pip install 'training-harness[liger]'" in line


@pytest.mark.parametrize("strategies, kw, said", [
    ({"tensor": {}}, {"layout": Layout(tensor=2)}, "not with tensor parallel"),
    ({"pipeline": {}}, {"layout": Layout(pipeline=2)}, "not with the pipeline"),
    ({"distill": {"teacher": "x"}}, {}, "distillation's loss needs the student's logits"),
])
def test_refused_beside(strategies, kw, said):
    found = reasons(plan({"liger": {}, **strategies}, **kw))
    assert any(said in r for r in found), found


def test_two_losses_and_no_patch_are_refused():
    assert "set cross_entropy = false" in only(plan({"liger": {"cross_entropy": True}}))
    assert "every patch is off" in only(plan({"liger": OFF}))


def test_refused_beside_the_fused_linear_cross_entropy():
    fused = get("fused")
    if "linear_cross_entropy" not in fused.space():
        pytest.skip("the fused strategy has no linear_cross_entropy setting yet")
    on = next(v for v in fused.space()["linear_cross_entropy"].values
              if v not in (False, "eager", None))
    p = plan({"liger": {}, "fused": {"linear_cross_entropy": on}})
    assert any("one fused head at a time" in r for r in reasons(p))


@pytest.fixture
def restored(monkeypatch):
    """Liger's patches reach module globals (the rotary function, the classes, torch's
    cross-entropy): each is put back after the test."""
    import torch.nn.functional as F
    from transformers.models.llama import modeling_llama

    for name in ("apply_rotary_pos_emb", "LlamaRMSNorm", "LlamaMLP"):
        monkeypatch.setattr(modeling_llama, name, getattr(modeling_llama, name))
    monkeypatch.setattr(F, "cross_entropy", F.cross_entropy)
    return modeling_llama


@pytest.mark.parametrize("asked", ["rope", "rms_norm", "swiglu", "fused_linear_cross_entropy"])
def test_it_patches_exactly_what_is_asked(asked, restored):
    from liger_kernel.transformers import LigerRMSNorm, LigerSwiGLUMLP
    from liger_kernel.transformers.rope import liger_rotary_pos_emb

    workload = load_workload("hf:llama", LLAMA)
    model = workload.build_model()
    setup = Setup(model=model, device=torch.device("cpu"))
    liger = get("liger")
    liger.apply(Phase.MODULE_SWAP, setup, liger.parse({**OFF, asked: True}))

    norms = [m for n, m in model.named_modules() if n.endswith("norm")]
    mlps = [layer.mlp for layer in model.model.layers]
    assert len(norms) == 5 and len(mlps) == 2
    patched = {
        "rms_norm": [m.forward.__func__ is LigerRMSNorm.forward for m in norms],
        "swiglu": [m.forward.__func__ is LigerSwiGLUMLP.forward for m in mlps],
        "rope": [restored.apply_rotary_pos_emb is liger_rotary_pos_emb],
        "fused_linear_cross_entropy": ["forward" in vars(model)],
    }
    for part, flags in patched.items():
        assert all(flags) if part == asked else not any(flags), (part, flags)
    assert (setup.loss_override is not None) == (asked == "fused_linear_cross_entropy")
    assert setup.notes and asked in setup.notes[-1]


def test_the_estimate_drops_the_logits_with_the_fused_loss_only():
    """Fused linear cross-entropy: the fused strategy's chunked loss stands in for it
    (no b·s·V logits); the other patches are estimated as the plan without them."""
    from training_harness.estimator import estimate

    args = {**LLAMA, "vocab_size": 4096, "seq_len": 64, "max_position_embeddings": 64}
    workload = load_workload("hf:llama", args)

    def est(strategies):
        p = plan(strategies, args=args).replace(micro_batch_size=4, global_batch_size=4)
        return estimate(p, workload, GPU)

    plain, fused, kernels = est({}), est({"liger": {}}), est(
        {"liger": {"fused_linear_cross_entropy": False}})
    assert fused.memory["logits"] < plain.memory["logits"] / 10
    assert fused.peak_memory_bytes < plain.peak_memory_bytes
    assert kernels.peak_memory_bytes == plain.peak_memory_bytes
    said = [a for a in fused.assumptions if a.startswith("liger (")]
    assert len(said) == 1 and "except the logits" in said[0]
    assert any(a.startswith("liger (rope, rms_norm, swiglu)") and "without it" in a
               for a in kernels.assumptions)


def test_the_hf_trainer_export_is_its_own_switch(tmp_path):
    import transformers as tf  # after training_harness (above): torchvision's mend

    from training_harness.export import export_plan

    settings = {**OFF, "rms_norm": True, "fused_linear_cross_entropy": True}
    exp = export_plan(plan({"liger": settings}), "hf-trainer", "test")
    assert "liger" in exp.carried
    path = tmp_path / "args.json"
    path.write_text(exp.text)
    (args,) = tf.HfArgumentParser(tf.TrainingArguments).parse_json_file(path)
    assert args.use_liger_kernel
    assert args.liger_kernel_config == {**settings, "cross_entropy": False}


# Run in a fresh interpreter: TRITON_INTERPRET is read when triton is first imported.
# One process for every case (its imports are most of its time); Liger's module-wide
# patches are put back after each.
NUMERICS = textwrap.dedent("""
    import json, sys
    import training_harness  # noqa: F401  (torchvision's mend before transformers)
    import torch
    import torch.nn.functional as F
    from transformers.models.llama import modeling_llama
    from training_harness.core.plan import Plan
    from training_harness.measure.batches import split_batch
    from training_harness.strategies.base import Phase
    from training_harness.strategies.compose import compose
    from training_harness.strategies.registry import get
    from training_harness.workloads import load_workload

    args, cases = json.loads(sys.argv[1]), json.loads(sys.argv[2])
    workload = load_workload("hf:llama", args)
    NAMES = ("apply_rotary_pos_emb", "LlamaRMSNorm", "LlamaMLP")
    module_wide = {n: getattr(modeling_llama, n) for n in NAMES}, F.cross_entropy

    def run(patches):
        torch.manual_seed(0)
        model = workload.build_model()
        setup = compose(model, Plan(workload="hf:llama", workload_args=args,
                                    micro_batch_size=2, global_batch_size=2), "cpu")
        if patches is not None:
            liger = get("liger")
            liger.apply(Phase.MODULE_SWAP, setup, liger.parse(patches))
        heads = []
        model.lm_head.register_forward_hook(lambda *a: heads.append(1))
        model.train()
        loss_fn = setup.loss_override(workload.loss) if setup.loss_override else workload.loss
        try:  # the first step's gradients, then three AdamW steps' losses
            loss_fn(setup.model, workload.batch(2, 0, "cpu")).backward()
            grads = {n: p.grad.double().tolist() for n, p in model.named_parameters()}
            setup.optimizer.zero_grad(set_to_none=True)
            losses = [setup.step(split_batch(workload.batch(2, s, "cpu"), 1),
                                 workload.loss).item() for s in range(3)]
        except Exception as e:
            return {"error": f"{type(e).__name__}: {e}"}
        finally:
            for n, v in module_wide[0].items():
                setattr(modeling_llama, n, v)
            F.cross_entropy = module_wide[1]
        return {"losses": losses, "grads": grads, "head_calls": len(heads)}

    print(json.dumps({name: run(patches) for name, patches in cases.items()}))
""")
CASES = {"plain": None,
         "rope+flce": {**OFF, "rope": True, "fused_linear_cross_entropy": True},
         "rms_norm": {**OFF, "rms_norm": True}, "swiglu": {**OFF, "swiglu": True}}


@pytest.fixture(scope="module")
def interpreted() -> dict:
    """Each case's results in Triton's interpreter, from one subprocess."""
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    done = subprocess.run([sys.executable, "-c", NUMERICS, json.dumps(LLAMA),
                           json.dumps(CASES)], capture_output=True, text=True, env=env,
                          timeout=240)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def assert_close(plain: dict, liger: dict) -> None:
    assert liger["losses"] == pytest.approx(plain["losses"], rel=1e-5)
    assert plain["losses"][-1] < plain["losses"][0]  # it trains
    for name, g in plain["grads"].items():
        torch.testing.assert_close(torch.tensor(liger["grads"][name]), torch.tensor(g),
                                   rtol=1e-5, atol=1e-6, msg=name)


@pytest.mark.slow
def test_rope_and_fused_linear_cross_entropy_in_the_interpreter(interpreted):
    plain, liger = interpreted["plain"], interpreted["rope+flce"]
    assert "error" not in liger, liger
    assert_close(plain, liger)
    assert plain["head_calls"] > 0 and liger["head_calls"] == 0  # no logits made in training


INTERPRETER_LIMIT = "'float' object has no attribute 'to'"


@pytest.mark.slow
@pytest.mark.parametrize("asked", ["rms_norm", "swiglu"])
def test_rms_norm_and_swiglu_in_the_interpreter(asked, interpreted):
    error = interpreted[asked].get("error")
    if error is not None and INTERPRETER_LIMIT in error:
        scalar = {"rms_norm": "eps", "swiglu": "gate_multiplier"}[asked]
        pytest.skip(f"Liger's {asked} kernel calls .to() on its scalar argument {scalar}, "
                    "which Triton's interpreter passes as a Python float "
                    f"({error}); it runs compiled on a GPU (test_all_patches_on_a_gpu)")
    assert error is None, error
    assert_close(interpreted["plain"], interpreted[asked])


@pytest.mark.gpu
def test_all_patches_on_a_gpu():
    """The four patches in fp32 against the unpatched model, through compose on CUDA:
    three steps' losses and the first gradients within 1e-4 (Liger's kernels reduce in
    another order than torch's)."""
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")
    from training_harness.measure.batches import split_batch
    from training_harness.strategies.compose import compose

    workload = load_workload("hf:llama", LLAMA)
    results = []
    for strategies in ({}, {"liger": {}}):
        torch.manual_seed(0)
        p = plan(strategies)
        setup = compose(workload.build_model(), p, "cuda")
        losses = [setup.step(split_batch(workload.batch(2, s, "cuda"), 1), workload.loss).item()
                  for s in range(3)]
        results.append(losses)
    assert results[1] == pytest.approx(results[0], rel=1e-4)
    assert results[0][-1] < results[0][0]

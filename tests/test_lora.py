"""LoRA through peft on hf: models: only the adapters get gradients and change, the base
weights stay as loaded (with checkpointing, bf16 autocast and accumulation too), a saved
model has the adapters merged, refusals say why, and its settings are in the maths key."""

from __future__ import annotations

import pytest
import torch

from tests.distributed.run_case import HF, TIMEOUT_S
from tests.workloads.run_hf_case import LORA_CASES, STEPS
from tests.workloads.tiny_hf import workload_spec
from training_harness.core.device import RuntimeEnv
from training_harness.core.errors import HarnessError
from training_harness.core.plan import Layout, Plan
from training_harness.core.target import TargetSpec, maths_key
from training_harness.measure import convergence
from training_harness.measure.batches import split_batch
from training_harness.strategies import registry
from training_harness.strategies.compose import compose, reasons_against
from training_harness.workloads import load_workload
from training_harness.workloads.trained import _plain_state, load_trained, save_trained

LLAMA = dict(num_hidden_layers=2, hidden_size=32, intermediate_size=64, num_attention_heads=2,
             num_key_value_heads=2, vocab_size=64, seq_len=16)
CPU = RuntimeEnv.detect("cpu")


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    """One intra-op thread: tiny models gain nothing from two, and on a shared machine
    two threads spin-wait on each other (steps of 1 s instead of 10 ms)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(autouse=True)
def needs_peft():
    try:
        registry.get("lora")
        from training_harness.strategies.lora import peft_module

        peft_module()
    except HarnessError as e:
        pytest.skip(str(e))


def plan(settings=None, **others) -> Plan:
    batch = 8 if "accumulation" in others else 4
    p = Plan(workload="hf:llama", workload_args=LLAMA, device="cpu", micro_batch_size=4,
             global_batch_size=batch, strategies={"lora": dict(settings or {}), **others})
    p.optimizer.lr = 1e-2
    return p


@pytest.mark.parametrize("others", [
    {},
    {"checkpoint": {}, "amp": {"dtype": "bf16"}, "accumulation": {}},
], ids=["alone", "checkpoint+bf16+accumulation"])
def test_only_the_adapters_train_and_the_base_weights_stay(others):
    p = plan(**others)
    w = load_workload(p.workload, p.workload_args)
    torch.manual_seed(0)
    model = w.build_model()
    base = {n: t.clone() for n, t in model.state_dict().items()}
    setup = compose(model, p, "cpu")
    adapters = {n: q.detach().clone() for n, q in setup.model.named_parameters()
                if "lora_" in n}
    assert adapters and all(q.requires_grad == ("lora_" in n)
                            for n, q in setup.model.named_parameters())
    # one step by hand: gradients on the adapters only
    with setup.autocast():
        w.loss(setup.model, w.batch(4, 0, "cpu")).backward()
    grads = {n for n, q in setup.model.named_parameters() if q.grad is not None}
    assert grads == set(adapters)
    setup.model.zero_grad(set_to_none=True)
    for i in range(3):
        setup.step(split_batch(w.batch(p.batch_size, i, "cpu"), p.accumulation_steps), w.loss)
    now = dict(setup.model.named_parameters())
    assert any(not torch.equal(now[n], a) for n, a in adapters.items())  # the adapters moved
    for name, value in setup.model.state_dict().items():
        if "lora_" in name:
            continue
        plain = name.replace("_checkpoint_wrapped_module.", "").replace(".base_layer.", ".")
        assert torch.equal(value, base[plain]), f"{plain} changed"
    assert any(n.startswith("lora: rank 8, alpha 16 on q_proj, v_proj") for n in setup.notes)


def test_a_saved_model_has_the_adapters_merged(tmp_path):
    p = plan({"target_modules": ["q_proj", "down_proj"], "rank": 4})
    w = load_workload(p.workload, p.workload_args)
    torch.manual_seed(0)
    setup = compose(w.build_model(), p, "cpu")
    for i in range(2):
        setup.step([w.batch(4, i, "cpu")], w.loss)
    ids, _ = w.batch(2, 99, "cpu")
    with torch.no_grad():
        expected = setup.model(input_ids=ids).logits
    folder = save_trained(setup.model, p.workload, p.workload_args, tmp_path / "merged")
    _, merged = load_trained(folder)
    with torch.no_grad():
        torch.testing.assert_close(merged(input_ids=ids).logits, expected, rtol=1e-4,
                                   atol=1e-5)
    assert not any("lora_" in n for n in _plain_state(setup.model))


def test_refused_with_the_reason(monkeypatch):
    def reasons(p):
        return " ".join(reasons_against(p, CPU))

    assert "hf: models only; 'gpt' is not one" in reasons(
        plan().replace(workload="gpt", workload_args={}))
    assert "not with tensor parallel" in reasons(
        plan(tensor={}).replace(layout=Layout(tensor=2)))
    assert "not with the pipeline" in reasons(
        plan(pipeline={}).replace(layout=Layout(pipeline=2)))
    assert "not with float8" in reasons(plan(float8={"emulate": True}))
    import training_harness.strategies.lora as lora

    def missing():
        raise HarnessError("this workload needs the 'peft' package; install it with "
                           "pip install -e \".[peft]\"")

    monkeypatch.setattr(lora, "peft_module", missing)
    assert '.[peft]' in reasons(plan())
    monkeypatch.undo()
    w = load_workload("hf:llama", LLAMA)
    with pytest.raises(HarnessError, match="lora: .*target_modules"):
        compose(w.build_model(), plan({"target_modules": ["no_such_layer"]}), "cpu")


def test_its_settings_are_in_the_maths_key():
    keys = {maths_key(plan().replace(strategies={}).to_dict(), 0, "cpu")}
    for settings in ({}, {"rank": 4}, {"alpha": 32.0}, {"target_modules": ["q_proj"]}):
        keys.add(maths_key(plan(settings).to_dict(), 0, "cpu"))
    assert len(keys) == 5
    kept = convergence.maths_plan(plan({"rank": 4}).replace(target=TargetSpec(loss=1.0)))
    assert kept.strategies["lora"] == {"rank": 4}  # trained with it


@pytest.mark.distributed
@pytest.mark.timeout(TIMEOUT_S + 60)
@pytest.mark.parametrize("case", LORA_CASES, ids=[c.name for c in LORA_CASES])
def test_lora_beside_ddp_and_zero_trains_as_one_process_does(case, parallel_records):
    """2 gloo ranks (the session's launch of the hf: parallel cases) against one process
    with the same LoRA and the same global batches of 8: 1e-4 on each step's loss."""
    records = parallel_records(HF)
    if "skipped" in records[0][case.name]:
        pytest.skip(records[0][case.name]["skipped"])
    got = [sum(r[case.name]["losses"][s] for r in records.values()) / len(records)
           for s in range(STEPS)]
    name, args = workload_spec(case.model)
    w = load_workload(name, args)
    p = Plan(workload=name, workload_args=args, device="cpu", micro_batch_size=8,
             global_batch_size=8, strategies={k: v for k, v in case.strategies.items()
                                              if k not in ("ddp", "zero")})
    p.optimizer.lr = case.lr
    torch.manual_seed(0)
    setup = compose(w.build_model(), p, "cpu")
    want = [setup.step([w.batch(8, s, "cpu")], w.loss).item() for s in range(STEPS)]
    assert max(abs(a - b) for a, b in zip(got, want, strict=True)) <= 1e-4, (got, want)
    assert any(n.startswith("lora: rank 8") for n in records[0][case.name]["notes"])

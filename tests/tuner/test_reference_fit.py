"""The references' micro-batch comes down until the prediction fits the memory budget."""

from __future__ import annotations

import types

from tests.tuner.conftest import study_table
from training_harness.core.errors import HarnessError
from training_harness.study import references
from training_harness.study.machine_facts import MachineFacts
from training_harness.study.search_space import SearchSpace
from training_harness.study.study_file import Study
from training_harness.tune.model.estimator_model import largest_fitting_micro

GIB = 2**30


class FakeTorchHelper:
    """Predicts 1 GiB per sample of the micro-batch; refuses what `refuse` names."""

    def __init__(self, refuse=()):
        self.asked, self.refuse = [], set(refuse)

    def prepare(self, plan, peaks=None, phases=None):
        self.asked.append(plan.micro_batch_size)
        if plan.micro_batch_size in self.refuse:
            raise HarnessError("refused")
        return types.SimpleNamespace(predicted={"peak_memory_bytes": plan.micro_batch_size * GIB})


def _setup(device_type="cuda"):
    space = SearchSpace(Study.from_dict(study_table()), device_type, {})
    facts = MachineFacts(device_type, "dev", 1, 80 * GIB)
    return space, facts, space.params_for(references.baseline(space))


def test_the_baseline_takes_the_largest_micro_batch_that_fits():
    space, facts, params = _setup()
    assert params["micro_batch_size"] == 16  # quickstart: 4, 8, 16
    probe = FakeTorchHelper()
    # 1 GiB of CUDA context is assumed before any trial: 8 + 1 fits in 10 GiB, 16 + 1 not
    fitted = largest_fitting_micro(space, params, probe, facts, 10 * GIB)
    assert fitted == {**params, "micro_batch_size": 8} and probe.asked == [16, 8]
    assert largest_fitting_micro(space, params, FakeTorchHelper(), facts, 40 * GIB) == params


def test_nothing_fits_or_refused_leaves_the_reference_as_it_was():
    space, facts, params = _setup()
    assert largest_fitting_micro(space, params, FakeTorchHelper(), facts, 2 * GIB) == params
    helper = FakeTorchHelper(refuse={16})
    assert largest_fitting_micro(space, params, helper, facts, 10 * GIB) == params

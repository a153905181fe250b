"""What a study is: study files (`study_file`, `storage_spec`; each key's meaning is the
docstring under its field, listed by `keys`, written into docs/tuning.md by `keys_doc`),
the default study per device (`defaults`), the conditional search space from Optuna
parameters to a Plan (`search_space`), the two reference configurations every study
starts with (`references`), and the facts about this machine a study needs (`facts`),
which `checks` works out against the strategy registry in the tuner's torch-side helper
(training_harness.measure.torch_helper_server). It imports training_harness.core; strategies and
training_harness.workloads only inside the functions of `checks` that helper runs. The tuner
(training_harness.tune) and the command line import it; it imports neither.
"""

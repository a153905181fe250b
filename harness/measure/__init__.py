"""Inside a trial's own processes, where torch runs: the rank entry point
(`rank_main`, `rank_process`), checking a plan once and rebuilding it in each rank
(`prepare`), the trial loop (`trial_loop`, `batches`, `distributed`), timing,
memory, NVML, peak FLOP/s (`peaks`: the datasheet's, the measured, the one MFU
uses), the per-machine cache (`cache`), combining the ranks' figures (`ranks`),
the step log the tuner reads (`step_log`), the environment record (`env`), and the
tuner's torch-side helper (torch_helper_server). It may import training_harness.core,
training_harness.study, training_harness.estimator, training_harness.workloads,
training_harness.records and strategies;
never training_harness.launch, training_harness.tune or training_harness.cli, which sit above it.
"""

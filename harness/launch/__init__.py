"""Launching one trial in its own processes and collecting its record: the local
launcher (`local`: the ranks of a one-node trial forked from the command's rank server,
`rank_server`, each fork running `fork_child`; or torchrun across nodes, with a hard
timeout), one plan prepared and launched the one way (`run`), finding and stopping
a trial's processes (`procs`), bounded log files (`log_cap`), what the ranks left
behind (`rank_logs`) and the record of a trial that left none (`verdict`), the
tuner's client of its torch-side helper (`torch_helper`), and the Slurm launcher (`slurm`:
one trial as one job through submitit; what Slurm is asked, `slurm_queue`; what runs
in the job, `slurm_job`; what the job leaves for the record, `slurm_record`; whether
the compute nodes see the run folder, `slurm_shared`); up to a launcher's max_jobs
trials in flight at once, each waited on in its own thread (`jobs_in_flight`).
It runs in the tuner's process, so it imports no torch at module level; it may
import training_harness.measure (the torch-free parts at module level), training_harness.core,
training_harness.study and training_harness.records, never training_harness.tune or
training_harness.cli.
"""

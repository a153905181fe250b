"""What a trial leaves: the TrialResult record (`result`, schema 1), the tags a record
may carry (`tags`), the questions asked of records (`predicates`: finished,
may_be_best, ranked, ...) and the run folder of a study (`run_store`: trials.jsonl,
study.json, each trial's files), the contract `harness report` reads; and what the
records say together (`pooled`: one figure per configuration; `speedup`: a ratio with
its interval and verdict; `drift`; `verdict`: a study's, which the tuner's summary,
the report and `harness compare` share). It imports
training_harness.core only; the tuner, the trial loop and reports/ import it.
"""

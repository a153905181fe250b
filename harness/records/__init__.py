"""What a trial leaves: the TrialResult record (`result`, schema 1), the tags a record
may carry (`tags`), the questions asked of records (`predicates`: finished,
may_be_best, ranked, ...) and the run folder of a study (`run_store`: trials.jsonl,
study.json, each trial's files), the contract `harness report` reads. It imports
harness.core only; the tuner, the trial loop and reports/ import it.
"""

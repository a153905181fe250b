"""The search loop: ask Optuna, run the trial (or not), record it, tell Optuna (`loop`),
with the estimator's first guesses, its correction by measured trials, slow-trial
stopping, busy-machine re-measuring and several trials in flight."""

"""Optuna's parameter importances for a run, from its journal or rebuilt from the records.

A local Optuna journal in the run folder (or named by study.json) is read as it is.
A database storage is not contacted: the report reads only the run folder, so the
study is then rebuilt in memory from the records (one completed Optuna trial per
measured record: on/off and settings of each technique, layout, micro-batch size)
and `optuna.importance` runs on that.
"""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import optuna
from optuna.distributions import CategoricalDistribution

from training_harness.reports.frame import strategies_of
from training_harness.reports.load import Run
from training_harness.reports.style import REPEATS

EVALUATOR = "Optuna's default evaluator (PED-ANOVA)"


def param_importances(run: Run) -> tuple[dict[str, float] | None, str]:
    """(importances or None, a sentence saying where they come from or why there are none)."""
    study, source = stored_study(run)
    if study is None:
        study, source = rebuilt_study(run), source + "Rebuilt from the records in memory."
    complete = [t for t in study.get_trials(deepcopy=False)
                if t.state == optuna.trial.TrialState.COMPLETE]
    if len(complete) < 2:
        return None, source + " Importances need at least two completed trials."
    index = objective_index(run, len(study.directions))
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            imp = optuna.importance.get_param_importances(
                study, target=lambda t: t.values[index] if t.values else float("nan"))
    except (ValueError, RuntimeError, ZeroDivisionError) as e:
        return None, f"{source} Optuna could not compute importances: {e}"
    if not imp:
        return None, source + " No parameter took more than one value."
    what = "throughput" if index == 0 or len(study.directions) > 1 else "the objective"
    return dict(imp), (f"{source} Importance for {what}, by {EVALUATOR}, over "
                       f"{len(complete)} completed trial(s).")


def objective_index(run: Run, n: int) -> int:
    objective = run.study.get("objective")
    if isinstance(objective, list):
        for i, name in enumerate(objective[:n]):
            if any(w in str(name) for w in ("per_s", "throughput", "samples")):
                return i
    return 0


def journal_path(run: Run) -> tuple[Path | None, str]:
    storage = run.study.get("storage")
    text = str(storage.get("url") or storage.get("path") or "") \
        if isinstance(storage, dict) else str(storage or "")
    local = run.path / "optuna.journal"
    if local.is_file():
        return local, ""
    if text and "://" not in text:
        for p in (Path(text.split(":", 1)[-1]), run.path / Path(text).name):
            if p.suffix == ".journal" and p.is_file():
                return p, ""
    if "://" in text:
        return None, ("The study's Optuna storage is a database, which the report does not "
                      "contact (it reads only the run folder). ")
    return None, "No Optuna storage in the run folder. "


def stored_study(run: Run) -> tuple[optuna.Study | None, str]:
    path, why = journal_path(run)
    if path is None:
        return None, why
    from optuna.storages import JournalStorage
    from optuna.storages.journal import JournalFileBackend

    try:
        optuna.logging.set_verbosity(optuna.logging.WARNING)
        storage = JournalStorage(JournalFileBackend(str(path)))
        names = [s.study_name for s in storage.get_all_studies()]
        name = run.name if run.name in names else (names[0] if len(names) == 1 else None)
        if name is None:
            return None, f"{path.name} holds {len(names)} studies, none named {run.name!r}. "
        return optuna.load_study(study_name=name, storage=storage), f"From {path.name}."
    except Exception as e:  # a damaged or foreign journal must not stop the report
        return None, f"{path.name} could not be read ({type(e).__name__}: {e}). "


def _choice(v: Any) -> Any:
    return v if v is None or isinstance(v, (bool, int, float, str)) else str(v)


def rebuilt_study(run: Run) -> optuna.Study:
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study(direction="maximize", study_name=run.name)
    t = run.trials
    ok = t[(t["status"] == "ok") & ~t["phase"].isin(REPEATS) & t["samples_per_s"].notna()]
    names = sorted({n for tid in t.index for n in strategies_of(run.records[tid].get("plan"))})
    rows = []
    for tid in ok.index:
        row = ok.loc[tid]
        strategies = strategies_of(run.records[tid].get("plan"))
        params: dict[str, Any] = {"layout": row["layout"],
                                  "micro_batch_size": _choice(row["micro_batch_size"])}
        for name in names:
            params[name] = name in strategies
            for key, value in strategies.get(name, {}).items():
                params[f"{name}.{key}"] = _choice(value)
        rows.append((params, float(row["samples_per_s"])))
    keys = dict.fromkeys(k for params, _ in rows for k in params)
    choices = {k: list(dict.fromkeys(p[k] for p, _ in rows if k in p)) for k in keys}
    # a setting that never changed tells nothing: leave it out
    dists = {k: CategoricalDistribution(v) for k, v in choices.items() if len(v) > 1}
    for params, value in rows:
        kept = {k: v for k, v in params.items() if k in dists}
        study.add_trial(optuna.trial.create_trial(
            params=kept, distributions={k: dists[k] for k in kept}, value=value))
    return study

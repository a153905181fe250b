"""Stored records -> one `Run`: the study's facts, its records and a pandas frame of trials.

Reads only what a study or a bench run wrote (study.json, trials.jsonl or result.json
files); runs nothing and imports no torch. Optional keys may be missing: a record is
kept when it is a schema-1 TrialResult, and every record or line that is skipped is
named in `Run.notes`, which the page shows.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from training_harness.core.errors import HarnessError
from training_harness.reports.frame import NUMERIC, flatten, short_labels
from training_harness.reports.style import REPEATS

SCHEMA = 1


@dataclass
class Run:
    path: Path
    kind: str                       # "study" (a tuner's folder) or "bench" (one result.json)
    study: dict[str, Any]           # study.json, or what a bench folder implies
    records: dict[str, dict]        # trial_id -> TrialResult dict, in stored order
    trials: pd.DataFrame            # one row per record (reports.frame.flatten)
    notes: list[str] = field(default_factory=list)
    unreadable: list[str] = field(default_factory=list)  # of `notes`: trials.jsonl's damage
    baseline_id: str | None = None
    baseline_note: str = ""
    best_id: str | None = None
    best_note: str = ""

    @property
    def name(self) -> str:
        return str(self.study.get("name") or self.path.name)

    @property
    def memory_budget(self) -> float | None:
        value = self.study.get("memory_budget_bytes")
        return float(value) if isinstance(value, (int, float)) and value > 0 else None

    def row(self, trial_id: str | None) -> pd.Series | None:
        if trial_id is None or trial_id not in self.trials.index:
            return None
        return self.trials.loc[trial_id]


def load_run(path: str | Path) -> Run:
    """Read a study folder (`harness tune`) or a bench folder (`harness bench --out`)."""
    p = Path(path)
    if p.is_file() and p.name in ("result.json", "trials.jsonl", "study.json"):
        p = p.parent
    if not p.is_dir():
        raise HarnessError(f"{p}: no such folder; give the folder `harness tune` or "
                           "`harness bench --out` wrote")
    notes: list[str] = []
    unreadable: list[str] = []
    study = _read_json(p / "study.json", notes) if (p / "study.json").is_file() else None
    if (p / "trials.jsonl").is_file():
        raw = _read_jsonl(p / "trials.jsonl", unreadable)
        notes += unreadable
    else:
        files = sorted(p.glob("trials/*/result.json")) or sorted(p.glob("*/result.json"))
        if (p / "result.json").is_file():
            files = [p / "result.json"]
        elif files:
            notes.append(f"no trials.jsonl: read {len(files)} result.json files instead")
        raw = [(str(f.relative_to(p)), r) for f in files if (r := _read_json(f, notes))]
    kind = "study" if study is not None or (p / "trials.jsonl").is_file() else "bench"
    if study is None and not raw:
        raise HarnessError(f"{p}: no study.json, trials.jsonl or result.json here; give the "
                           "folder `harness tune` or `harness bench --out` wrote")
    records = _check(raw, notes)
    if study is None:
        first = next(iter(records.values()), {})
        one = kind == "bench" and len(records) == 1  # a folder of bench runs: its name
        study = {"name": first.get("study") or (one and (first.get("plan") or {}).get("name"))
                 or p.name}
        if kind == "study":
            notes.append("no study.json: the study's name, budget and objective are unknown")
    rows = [flatten(r, i, tid) for i, (tid, r) in enumerate(records.items())]
    trials = pd.DataFrame(rows).set_index("trial_id", drop=False) if rows else _empty()
    for col in NUMERIC:  # floats with NaN for missing, whatever the records held
        trials[col] = pd.to_numeric(trials[col], errors="coerce").astype(float)
    labels = short_labels({tid: r.get("plan") for tid, r in records.items()})
    trials["label"] = [labels.get(tid, "") for tid in trials.index]
    run = Run(p, kind, study, records, trials, notes, unreadable)
    _pick_baseline(run)
    _pick_best(run)
    return run


def _read_json(path: Path, notes: list[str]) -> Any:
    try:
        return json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        notes.append(f"{path.name}: not readable as JSON ({e}); skipped")
        return None


def _read_jsonl(path: Path, notes: list[str]) -> list[tuple[str, Any]]:
    """The records of trials.jsonl, each with where it is; every line that is not one
    is named (file, line, byte, its first bytes), and so is every copy of such a line
    that a tuner cut out (training_harness.records.run_store.RunStore.repair)."""
    from training_harness.records.jsonl_lines import read_trials

    try:
        trials = read_trials(path)
    except OSError as e:
        notes.append(f"{path.name}: not readable ({e}); skipped")
        return []
    notes += trials.notes()
    return [(f"{path.name} line {n}", record) for n, record in trials.records]


def _check(raw: list[tuple[str, Any]], notes: list[str]) -> dict[str, dict]:
    """Keep schema-1 records, keyed by trial id (the last one wins on a repeated id)."""
    records: dict[str, dict] = {}
    for i, (where, r) in enumerate(raw):
        if not isinstance(r, dict) or r.get("schema") != SCHEMA or "status" not in r:
            got = r.get("schema") if isinstance(r, dict) else type(r).__name__
            notes.append(f"{where}: not a schema-{SCHEMA} TrialResult (schema {got!r}); skipped")
            continue
        tid = r.get("trial_id")
        if tid is None:  # bench runs: one, or a folder of them named by their folders
            tid = "bench" if len(raw) == 1 else (Path(where).parent.name or f"#{i}")
        tid = str(tid)
        if tid in records:
            notes.append(f"trial {tid} is recorded more than once: the last record is used")
            del records[tid]
        records[tid] = r
    return records


def _empty() -> pd.DataFrame:
    return pd.DataFrame(columns=list(flatten({}, 0, "").keys())).set_index("trial_id", drop=False)


def _named(run: Run, which: str) -> str | None:
    """The trial study.json names as its `which` ("baseline", "best"), if it has a record."""
    given = run.study.get(f"{which}_trial_id")
    if given is not None and str(given) not in run.trials.index:
        run.notes.append(f"study.json names {which} trial {given}, which has no record")
        return None
    return None if given is None else str(given)


def _pick_baseline(run: Run) -> None:
    t = run.trials
    tagged = t[t["phase"] == "baseline"]
    plain = t[(t["strategies"] == "none") & (t["world_size"] == 1)]
    if (given := _named(run, "baseline")) is not None:
        run.baseline_id, run.baseline_note = given, "the study's baseline trial"
    elif len(tagged):
        run.baseline_id, run.baseline_note = str(tagged.index[0]), "the trial tagged baseline"
    elif len(plain):
        run.baseline_id = str(plain.index[0])
        run.baseline_note = "not tagged: the first one-device trial with no strategies (fp32)"


def _pick_best(run: Run) -> None:
    t = run.trials
    if (given := _named(run, "best")) is not None:
        run.best_id, run.best_note = given, "the study's best trial"
        return
    ok = t[(t["status"] == "ok") & ~t["phase"].isin(REPEATS) & t["samples_per_s"].notna()]
    budget = run.memory_budget
    if budget is not None:
        # what it needed (training_harness.core.memory_need)
        ok = ok[~(ok["budget_memory_bytes"] > budget)]
    if len(ok):
        run.best_id = str(ok["samples_per_s"].idxmax())
        run.best_note = ("chosen by the report: the most samples/s"
                         + (" within the memory budget" if budget else ""))

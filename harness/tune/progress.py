"""What `harness tune` shows while it runs: trials done, the best so far, time left.

On a terminal a live panel (rich) redraws twice a second; otherwise (a log file,
CI) each finished trial is one plain line, so logs read top to bottom.
"""

from __future__ import annotations

import time
from collections import Counter
from typing import Any

from training_harness.core.units import format_bytes, format_rate, format_seconds
from training_harness.records.plan_text import describe_plan, differing
from training_harness.records.predicates import busy_note, may_be_best
from training_harness.records.tags import tags_of
from training_harness.tune.budget import Clock


def clip(text: str, width: int) -> str:
    """`text` in at most `width` characters, cut at a word with "..." where it is longer
    (the record keeps the whole reason)."""
    if len(text) <= width:
        return text
    return text[:width - 3].rsplit(" ", 1)[0].rstrip(",;:") + "..."


def standing(record: dict[str, Any]) -> tuple[float, str] | None:
    """What ranks a finished trial (higher is better) and how it reads: its time to a
    target loss where it was trained to one (objective time_to_loss), else samples/s."""
    m = record.get("metrics") or {}
    conv, rate = m.get("convergence") or {}, m.get("samples_per_s")
    if m.get("time_to_target_s"):
        lo, hi = conv.get("time_spread_s") or (None, None)
        seeds = f" [{format_seconds(lo)}, {format_seconds(hi)}]" if lo is not None else ""
        step = (m.get("step_time_s") or {}).get("median")
        return -m["time_to_target_s"], (
            f"batch {conv.get('global_batch')} {conv.get('optimizer')}: to target "
            f"{format_seconds(m['time_to_target_s'])}{seeds} over {len(conv.get('seeds') or [])}"
            f" seed(s), {conv.get('steps_to_target'):g} steps x {format_seconds(step)}")
    return (rate, format_rate(rate, "samples/s")) if rate else None


class Progress:
    def __init__(self, name: str, clock: Clock, live: bool | None = None, quiet: bool = False,
                 store: Any = None, memory_budget: float | None = None,
                 defaults: dict[str, dict[str, Any]] | None = None):
        from rich.console import Console

        self.memory_budget = memory_budget  # an ok trial over it is never shown as best
        self.defaults = defaults or {}  # every strategy's settings' defaults (MachineFacts)
        self.name, self.clock, self.quiet = name, clock, quiet
        self.store = store  # a RunStore: the panel counts every worker's trials from it
        self._read_at = 0.0
        self.console = Console(stderr=False)
        self.live_mode = self.console.is_terminal if live is None else live
        self.counts: Counter[str] = Counter()
        # (rank: higher is better, trial id, description, its figure in words)
        self.best: tuple[float, Any, str, str] | None = None
        self.running: dict[Any, dict[str, Any]] = {}  # by trial id: several in flight on Slurm
        self.phase = "search"
        self._live = None

    def __enter__(self) -> Progress:
        if self.live_mode and not self.quiet:
            from rich.live import Live

            self._live = Live(console=self.console, get_renderable=self._panel,
                              refresh_per_second=2, transient=False)
            self._live.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        if self._live is not None:
            self._live.__exit__(*exc)
            self._live = None

    def event(self, kind: str, data: dict[str, Any]) -> None:
        if kind == "start":
            self.phase = data.get("phase", self.phase)
            self.running[data["trial_id"]] = {**data, "since": time.monotonic(), "steps": 0}
        elif kind == "step" and data.get("trial_id") in self.running:
            self.running[data["trial_id"]]["steps"] = data["steps"]
        elif kind == "end":
            self._ended(data)
        elif kind == "note":
            self.line(data["text"])

    def _ended(self, record: dict[str, Any]) -> None:
        self.running.pop(record["trial_id"], None)
        self.counts[record["status"]] += 1
        tags = tags_of(record)
        ranks = standing(record)
        if (self._candidate(record) and ranks and tags.get("phase") != "ablation"
                and (self.best is None or ranks[0] > self.best[0])):
            self.best = (ranks[0], record["trial_id"], self.describe(record["plan"]), ranks[1])
        if not self.live_mode:
            shown = ranks[1] if ranks else (record.get("reason") or "")
            shown = clip(shown.splitlines()[0], 100) if shown else ""
            busy = busy_note(record)
            if busy:
                shown += f" (measured while the machine was busy: {busy})"
            elif record["status"] == "ok" and not self._candidate(record):
                peak = (record.get("metrics") or {}).get("peak_memory_bytes")
                shown += (f" (peak memory {format_bytes(peak)}, over the budget "
                          f"{format_bytes(self.memory_budget)})")
            extra = f" (same as {tags['duplicate_of']})" if "duplicate_of" in tags else ""
            self.line(f"trial {record['trial_id']} [{tags.get('phase', '')}] "
                      f"{record['status']}{extra}: {shown} | {self.describe(record['plan'])}")

    def describe(self, plan: dict[str, Any]) -> str:
        """The plan's line, with every setting that differs from its default."""
        return describe_plan(plan, differing(plan, self.defaults))

    def _candidate(self, record: dict[str, Any]) -> bool:
        return may_be_best(record, self.memory_budget)

    def line(self, text: str) -> None:
        if self.quiet:
            return
        stamp = format_seconds(self.clock.elapsed())
        left = format_seconds(max(self.clock.left(), 0))
        if self._live is not None:
            self._live.console.print(f"[{stamp}, {left} left] {text}", markup=False)
        else:
            print(f"[{stamp}, {left} left] {text}", flush=True)

    def _from_store(self) -> None:
        """Counts and best over trials.jsonl: every worker's trials, not only ours."""
        if self.store is None or time.monotonic() - self._read_at < 2.0:
            return
        self._read_at = time.monotonic()
        counts: Counter[str] = Counter()
        best = None
        for r in self.store.records():
            counts[r["status"]] += 1
            ranks = standing(r)
            if (self._candidate(r) and ranks and tags_of(r).get("phase") != "ablation"
                    and (best is None or ranks[0] > best[0])):
                best = (ranks[0], r["trial_id"], self.describe(r["plan"]), ranks[1])
        self.counts, self.best = counts, best or self.best

    def _panel(self):
        from rich.table import Table

        self._from_store()

        t = Table.grid(padding=(0, 2))
        t.add_column(style="bold")
        t.add_column()
        done = sum(self.counts.values())
        counts = ", ".join(f"{n} {s}" for s, n in sorted(self.counts.items())) or "none yet"
        t.add_row("study", f"{self.name} ({self.phase})")
        t.add_row("time", f"{format_seconds(self.clock.elapsed())} elapsed, "
                          f"{format_seconds(max(self.clock.left(), 0))} left")
        t.add_row("trials", f"{done} done: {counts}")
        if self.best:
            t.add_row("best", f"{self.best[3]} (trial {self.best[1]}) {self.best[2]}")
        for c in list(self.running.values()):
            running = format_seconds(time.monotonic() - c["since"])
            t.add_row("running", f"trial {c['trial_id']} for {running}, {c['steps']} steps "
                                 f"measured | {self.describe(c['plan'])}")
        return t

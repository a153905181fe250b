"""`harness export` (a plan in another stack's config file) and `harness verify` (the
study's best re-run inside the Hugging Face Trainer): their flags and bodies."""

from __future__ import annotations

import argparse
from pathlib import Path

from training_harness.export.common import STACKS


def cmd_export(args: argparse.Namespace) -> int:
    from training_harness.export import default_out, export_plan, source_plan
    from training_harness.export.common import sidecar_path

    plan, source = source_plan(args.source)
    exp = export_plan(plan, args.to, str(source))
    out = Path(args.out) if args.out else default_out(source, plan, args.to, exp.suffix)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(exp.text)
    notes = sidecar_path(out)
    notes.write_text(exp.sidecar())
    print(f"wrote {out}: {plan.name} for {args.to} (its notes beside it: {notes.name})")
    print(f"carried: {', '.join(exp.carried)}")
    if exp.not_expressed:
        print(f"not expressed ({len(exp.not_expressed)}; also in {notes.name}):")
        for n in exp.not_expressed:
            print(f"  - {n.line()}")
    return 0


def cmd_verify(args: argparse.Namespace) -> int:
    from training_harness.core.errors import HarnessError
    from training_harness.export.verify import ranking, table, top_records, verify_one
    from training_harness.records.plan_text import varying

    if args.top < 1:
        raise HarnessError(f"--top {args.top}: give 1 or more configurations")
    if args.repeats < 1:
        raise HarnessError(f"--repeats {args.repeats}: give 1 or more runs per configuration")
    run = Path(args.run)
    records = top_records(run, args.top)
    out = Path(args.out) if args.out else run / "verify"
    print(f"verify {run}: its {len(records)} best configuration(s), each trained again in "
          f"the Hugging Face Trainer ({args.with_}) with the exported settings", flush=True)
    rows, differ = [], varying([r["plan"] for r in records])  # what tells the rows apart
    for r in records:
        row = verify_one(r, out / str(r["trial_id"]), args.timeout, bench=args.bench,
                         repeats=args.repeats, also=differ)
        state = (f"{row.trainer_rate:.2f} samples/s in the Trainer" if row.trainer_rate else
                 "cannot run" if row.cannot else "failed")
        if row.bench_rate:
            state += f", {row.bench_rate:.2f} in harness bench beside it"
        print(f"  trial {r['trial_id']}: {state}", flush=True)
        rows.append(row)
    print(table(rows))
    print(ranking(rows))
    versions = next((row.versions for row in rows if row.versions), None)
    if versions:
        print("in: " + ", ".join(f"{k} {v}" for k, v in versions.items()))
    print(f"files: {out}/<trial>/ (trainer.json, result.json, log.txt)")
    return 0 if any(row.trainer_rate for row in rows) else 1


def add_export_parsers(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("export", help="a study's best (or a plan) as another stack's config")
    p.add_argument("source", metavar="RUN|PLAN", help="a run folder (its best.toml) or a plan")
    p.add_argument("--to", required=True, choices=STACKS, help="the stack to write for")
    p.add_argument("--out", metavar="FILE",
                   help="where to write (default: beside the plan, <plan>.<stack>.<ext>)")
    p.set_defaults(func=cmd_export)

    v = sub.add_parser("verify", help="re-run a study's best in the Hugging Face Trainer")
    v.add_argument("run", metavar="RUN", help="a run folder of harness tune")
    v.add_argument("--with", dest="with_", default="hf-trainer", choices=["hf-trainer"],
                   help="the trainer to run them in")
    v.add_argument("--top", type=int, default=3, help="how many of the best (default 3)")
    v.add_argument("--timeout", type=float, default=600.0, metavar="SECONDS",
                   help="per configuration (default 600)")
    v.add_argument("--bench", action="store_true",
                   help="measure each with harness bench again beside its Trainer runs, "
                        "and compare with that (a machine whose load drifts)")
    v.add_argument("--repeats", type=int, default=1,
                   help="Trainer runs per configuration (and bench runs, with --bench); "
                        "the medians are compared (default 1)")
    v.add_argument("--out", metavar="FOLDER", help="default: RUN/verify")
    v.set_defaults(func=cmd_verify)

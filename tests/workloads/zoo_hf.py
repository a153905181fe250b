#!/usr/bin/env python
"""The zoo sweep over transformers' model types (tests.workloads.hf_zoo), and its table.

    python tests/workloads/zoo_hf.py                      # every type; writes the doc's table
    python tests/workloads/zoo_hf.py --types qwen2 t5     # some types; prints their rows

Types run in worker processes (`--workers`, one torch thread each), each type under a
timeout; a worker that dies takes only its current type with it (refused: "crashed").
With no --types the table in --doc (docs/benchmarks/zoo_hf_cpu_2026-11-24.md) is
rewritten between its markers, and --json gets every row (tests/zoo_hf.json, which
tests/test_zoo_hf.py holds the models to).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "benchmarks" / "zoo_hf_cpu_2026-11-24.md"
TABLE = ROOT / "tests" / "zoo_hf.json"
BEGIN, END = "<!-- zoo table begin -->", "<!-- zoo table end -->"


def run_worker(names: list[str], out: Path) -> subprocess.Popen:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore"}
    return subprocess.Popen([sys.executable, "-m", "tests.workloads.hf_zoo", str(out), *names],
                            cwd=ROOT, env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)


def read(out: Path) -> tuple[dict[str, dict], str | None]:
    """Finished rows, and the type a worker started but did not finish."""
    rows: dict[str, dict] = {}
    started = None
    if out.exists():
        for line in out.read_text().splitlines():
            item = json.loads(line)
            if "start" in item:
                started = item["start"]
            else:
                rows[item["model_type"]] = item
                started = None
    return rows, started


def sweep(names: list[str], workers: int) -> dict[str, dict]:
    chunks = [names[i::workers] for i in range(workers)]
    rows: dict[str, dict] = {}
    with tempfile.TemporaryDirectory() as tmp:
        live = []
        for i, chunk in enumerate(chunks):
            if chunk:
                out = Path(tmp) / f"w{i}.jsonl"
                live.append([run_worker(chunk, out), chunk, out])
        while live:
            time.sleep(0.5)
            for entry in list(live):
                proc, chunk, out = entry
                if proc.poll() is None:
                    continue
                done, started = read(out)
                rows.update(done)
                live.remove(entry)
                if started is not None:  # died on `started`: record it, go on with the rest
                    rows[started] = {"model_type": started, "status": "refused",
                                     "line": f"crashed: the worker exited with {proc.returncode}",
                                     "seconds": 0.0}
                rest = [n for n in chunk if n not in rows]
                if rest:
                    out.unlink(missing_ok=True)
                    live.append([run_worker(rest, out), rest, out])
    return rows


def table(rows: dict[str, dict]) -> str:
    lines = ["| model type | result | how / why |", "| --- | --- | --- |"]
    for name in sorted(rows):
        r = rows[name]
        lines.append(f"| `{name}` | {r['status']} | {r['line'].replace('|', '/')} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--types", nargs="*", help="model types (default: all)")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--doc", type=Path, default=DOC)
    parser.add_argument("--json", type=Path, default=TABLE)
    args = parser.parse_args()
    sys.path.insert(0, str(ROOT))
    from tests.workloads.hf_zoo import types

    names = args.types or types()
    start = time.perf_counter()
    rows = sweep(names, args.workers)
    took = time.perf_counter() - start
    ok = sum(r["status"] == "ok" for r in rows.values())
    summary = (f"{len(rows)} model types: {ok} ok, {len(rows) - ok} refused "
               f"({took:.0f} s, {args.workers} workers)")
    if args.types:
        print(table(rows))
        print(summary)
        return
    args.json.write_text(json.dumps({n: {"status": rows[n]["status"], "line": rows[n]["line"]}
                                     for n in sorted(rows)}, indent=1) + "\n")
    text = args.doc.read_text() if args.doc.exists() else f"{BEGIN}\n{END}\n"
    head, _, rest = text.partition(BEGIN)
    _, _, tail = rest.partition(END)
    args.doc.write_text(f"{head}{BEGIN}\n{summary}\n\n{table(rows)}\n{END}{tail}")
    print(summary)


if __name__ == "__main__":
    main()

"""Inside every rank of a trial: join the process group, run the trial, write the record.

    python -m training_harness.measure.rank_main PREPARED_JSON --result PATH --command CMD [--study
    S ...]

training_harness.launch.local starts this: on one node each rank a fork of its rank server
(training_harness.launch.rank_server) given torchrun's environment, else through torchrun.
The first line each rank writes to its stderr names the rank; the launcher reads
it to tell the ranks' logs apart. One process writes the record (rank 0 on one
node; see RankInfo.writes_result), atomically; the others write nothing.

Exit status: 0 when the trial ran to a record (ok, oom, diverged: the record says
which), 1 when it raised (its error file, TORCHELASTIC_ERROR_FILE, holds the
exception and its traceback), 2 for a plan this machine refuses.
"""

from __future__ import annotations

import argparse
import faulthandler
import os
import signal
import sys

if __name__ == "__main__":
    # A new interpreter (torchrun's rank, a Slurm job's), not a fork of the rank server:
    # the server's imports, made as it makes them (2.0 CPU-s against 3.0 with the
    # collector on), so that this rank runs on the heap a forked one has.
    import training_harness.measure.rank_preload  # noqa: F401

from torch.distributed.elastic.multiprocessing.errors import record

from training_harness.measure.rank_process import LOG_HEADER as HEADER


def _parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m training_harness.measure.rank_main")
    p.add_argument("prepared",
                   help="the prepared plan (prepared.json, training_harness.core.prepared)")
    p.add_argument("--result", required=True, help="where the record is written (JSON)")
    p.add_argument("--command", default="", help="the command that re-runs this trial")
    p.add_argument("--study")
    p.add_argument("--trial-id")
    return p.parse_args(argv)


def _trial_id(text: str | None) -> int | str | None:
    return int(text) if text is not None and text.isdigit() else text


@record
def main(argv: list[str] | None = None) -> int:
    args = _parse(argv)
    from training_harness.measure.rank_process import RankInfo, append_output

    append_output()  # the launcher cuts logs past their cap; carry on at the new end
    info = RankInfo.from_env()
    print(f"{HEADER} {info.describe()}, pid {os.getpid()}", file=sys.stderr, flush=True)
    # A rank stopped (a hang, or another rank's failure) leaves the stack of every
    # thread in its stderr before it goes; when it may not (several SIGTERMs at once),
    # the launcher asked first for the stack file (training_harness.launch.procs.dump_stacks).
    faulthandler.register(signal.SIGTERM, all_threads=True, chain=True)
    from training_harness.measure.rank_process import listen_for_stack_requests, watch_launcher

    listen_for_stack_requests()
    watch_launcher()  # and if the launcher dies, stop too

    from training_harness.strategies.registry import load_builtins

    load_builtins()
    from training_harness.core.prepared import PreparedPlan
    from training_harness.measure import distributed
    from training_harness.measure.prepare import from_prepared
    from training_harness.measure.trial_loop import run_trial

    prep = from_prepared(PreparedPlan.read(args.prepared), info.local_rank)
    distributed.init(prep.plan, prep.device, info)
    result = run_trial(prep, args.command, args.study, _trial_id(args.trial_id), info)
    if info.writes_result:
        result.write(args.result)
    distributed.destroy()
    print(f"{HEADER} rank {info.rank} finished: {result.status}", file=sys.stderr, flush=True)
    return 0


def _leave(code: int) -> None:
    """Exit without the interpreter's teardown: the record is written and the process
    group destroyed, and tearing down torch's C++ threads at exit sometimes aborts
    (std::terminate, SIGABRT: 1 in 8 two-node gloo trials here) after a good trial."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    from training_harness.core.errors import HarnessError

    try:
        _leave(main())
    except HarnessError as e:
        print(f"{HEADER} error: {e}", file=sys.stderr)
        _leave(e.exit_code)

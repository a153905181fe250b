"""`harness bench` starts its rank server before anything else it does.

The server's imports (torch, torch._dynamo: training_harness.measure.rank_preload) are the
longest wait of a bench; the command line's own (argparse's parsers pull in the
tuner's modules, optuna and numpy: about 0.5 s) and reading the plan need no torch,
so they run beside them, on another core, instead of before them.

Only for what will fork its ranks from that server: one node, the local launcher.
A plan whose [cluster] table sends it to Slurm is only known once the plan is read;
its server is stopped as soon as the plan says so, and the server of a plan refused
as a user's mistake at the command's exit (nothing of a trial has started by then).
"""

from __future__ import annotations

# flags, and the one value of each that keeps the trial in forks of this machine's server
_HERE = {"--nnodes": "1", "--launcher": "local", "--node-rank": "0", "--rdzv-endpoint": None}
_NOTHING_RUNS = ("-h", "--help")


def forks_here(argv: list[str]) -> bool:
    """Whether `harness bench ARGV` (the words after `bench`) will fork its ranks from
    this process's rank server: not with a flag that sends them elsewhere, nor help."""
    flags = {a.split("=", 1)[0] for a in argv if a.startswith("-")}
    if flags & set(_NOTHING_RUNS):
        return False
    return all(_value(argv, flag) in (None, here) for flag, here in _HERE.items())


def _value(argv: list[str], flag: str) -> str | None:
    for i, word in enumerate(argv):
        if word == flag and i + 1 < len(argv):
            return argv[i + 1]
        if word.startswith(flag + "="):
            return word.split("=", 1)[1]
    return None


def start_rank_server(argv: list[str]) -> None:
    """Start the rank server now when `harness bench ARGV` will use it."""
    if forks_here(argv):
        from training_harness.launch import rank_server

        rank_server.start_now()

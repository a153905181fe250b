"""The launcher's decisions without starting processes: combining ranks, reading logs."""

from __future__ import annotations

import json
import math

import pytest
import torch

from training_harness.cli.main import main
from training_harness.core.errors import HarnessError
from training_harness.core.plan import Layout, Plan
from training_harness.launch.local import check_nodes
from training_harness.launch.rank_logs import (
    agent_root_cause,
    describe_exit,
    read_rank_logs,
    root_cause,
    tail,
)
from training_harness.measure.rank_process import RankInfo
from training_harness.measure.ranks import combine, step_loss


def figures(rank, times, peak):
    memory = {"allocated": None, "reserved": None, "rss": peak, "rss_base": 1, "nvml_used": None}
    return {"rank": rank, "host": "h", "step_times_s": times, "peak_memory_bytes": peak,
            "memory": memory, "loss_last": 1.0}


def test_combine_takes_the_slowest_rank_per_step_and_the_largest_peak():
    job = combine([figures(0, [1.0, 3.0, 2.0], 10), figures(1, [2.0, 1.0, 2.5], 30)])
    assert job["step_times_s"] == [2.0, 3.0, 2.5]
    assert job["peak_memory_bytes"] == 30 and job["memory"]["rss"] == 30
    assert [r["rank"] for r in job["per_rank"]] == [0, 1]
    assert "step_times_s" not in job["per_rank"][0]


def test_step_loss_in_one_process():
    one = RankInfo()
    assert step_loss(torch.tensor(2.5), one, torch.device("cpu")).value == 2.5
    bad = step_loss(torch.tensor(float("nan")), one, torch.device("cpu"))
    assert not bad.finite and bad.bad_ranks == [0] and math.isnan(bad.value)
    none = step_loss(None, one, torch.device("cpu"))  # a pipeline stage with no loss
    assert none.finite and none.value is None


def rank_folder(root, rank, error=None, stamp=100, stderr=""):
    folder = root / str(rank)
    folder.mkdir(parents=True)
    header = f"harness worker: rank {rank} of 2, local rank {rank}, node 0\n"
    (folder / "stderr.log").write_text(header + stderr)
    if error:
        (folder / "error.json").write_text(json.dumps(
            {"message": {"message": error, "extraInfo": {"py_callstack": "tb",
                                                         "timestamp": str(stamp)}}}))
    return folder


def test_root_cause_is_not_an_error_caused_by_another_rank_going_away(tmp_path):
    rank_folder(tmp_path, 0, "RuntimeError: [gloo] Connection closed by peer", stamp=100)
    rank_folder(tmp_path, 1, "ValueError: the real problem", stamp=101)
    logs = read_rank_logs(tmp_path)
    assert [r.rank for r in logs] == [0, 1]
    assert root_cause(logs).rank == 1


def test_the_quoted_stderr_ends_at_the_error_not_at_an_abort_after_it(tmp_path):
    error = "RuntimeError: injected failure on rank 1 at step 1"
    stderr = ("[rank1]: Traceback (most recent call last):\n"
              '[rank1]:   File "w.py", line 60, in loss\n'
              f"[rank1]: {error}\n"
              "terminate called without an active exception\n"
              "Fatal Python error: Aborted\n\n"
              "Thread 0x7f (most recent call first):\n  <no Python frame>\n"
              "Extension modules: numpy, torch._C (total: 2)\n")
    rank_folder(tmp_path, 1, error, stderr=stderr)
    quoted = read_rank_logs(tmp_path)[0].last_lines(3).splitlines()
    assert quoted[:3] == stderr.splitlines()[:3]
    assert quoted[3] == ("[then 5 more lines, the first: "
                         "terminate called without an active exception]")
    assert len(quoted) == 4
    # With nothing after the error, or no error found, the plain last lines.
    rank_folder(tmp_path, 2, "ValueError: not printed", stderr="a\nb\nc\n")
    assert read_rank_logs(tmp_path)[1].last_lines(2) == "b\nc"


def test_where_a_stopped_rank_was(tmp_path):
    dump = (
        'Thread 0x01 (most recent call first):\n'
        '  File "/x/threading.py", line 320 in wait\n\n'
        'Current thread 0x02 (most recent call first):\n'
        '  File "/w/tests/faulty_workload.py", line 59 in loss\n'
        '  File "/w/harness/measure/trial_loop.py", line 159 in measure\n'
        '  File "/w/harness/measure/rank_main.py", line 61 in main\n'
        '  File "<frozen runpy>", line 198 in _run_module_as_main\n'
    )
    rank_folder(tmp_path, 1, stderr=dump)
    assert read_rank_logs(tmp_path)[0].where() == "in loss at faulty_workload.py:59"
    # The stack it wrote when asked comes first; a dump in its stderr is the fallback
    # (one cut short by a second SIGTERM says nothing).
    rank_folder(tmp_path, 2, stderr="Current thread 0x02 (most recent call first):\n")
    (tmp_path / "stack-rank2.txt").write_text(dump.replace("line 59", "line 61"))
    assert read_rank_logs(tmp_path)[1].where() == "in loss at faulty_workload.py:61"


def test_torchruns_first_observed_failure_is_read():
    summary = """Failures:
[1]:
  rank      : 0 (local_rank: 0)
  exitcode  : -15 (pid: 18189)  (SIGTERM)
------------------------------------------------------------
Root Cause (first observed failure):
[0]:
  time      : 2026-11-21_11:01:15
  host      : localhost
  rank      : 1 (local_rank: 1)
  exitcode  : 3 (pid: 18190)
  error_file: <N/A>
"""
    assert agent_root_cause(summary) == (1, 3)
    assert agent_root_cause("nothing here") is None
    assert "SIGKILL" in describe_exit(-9) and describe_exit(3) == "exit code 3"


def test_tail_reads_only_the_end(tmp_path):
    path = tmp_path / "big.log"
    path.write_text("".join(f"line {i}\n" for i in range(100_000)))
    text = tail(path, 1000)
    assert len(text) <= 1000 and text.startswith("line ") and text.endswith("line 99999\n")


def test_a_huge_error_file_is_not_read_whole(tmp_path, monkeypatch):
    monkeypatch.setattr("training_harness.launch.rank_logs.ERROR_FILE_LIMIT", 1000)
    rank_folder(tmp_path, 0, "RuntimeError: " + "x" * 2000)
    log = read_rank_logs(tmp_path)[0]
    assert log.error.startswith("an error too large to read (error.json: ")
    assert log.traceback is None


def test_node_layouts_are_checked_before_anything_starts(tmp_path, capsys):
    plan = Plan(layout=Layout(data=2), strategies={"ddp": {}})
    with pytest.raises(HarnessError, match="needs --rdzv-endpoint"):
        check_nodes(plan, 2, 0, None)
    with pytest.raises(HarnessError, match="do not split evenly over 3 nodes"):
        check_nodes(plan, 3, 0, "h:1")
    with pytest.raises(HarnessError, match="--node-rank 2"):
        check_nodes(plan, 2, 2, "h:1")
    with pytest.raises(HarnessError, match="write HOST:PORT"):
        check_nodes(plan, 2, 0, "nohost")
    check_nodes(plan, 2, 1, "10.0.0.1:29500")
    # NCCL takes one rank per GPU: two ranks on a one-GPU node are refused up front.
    with pytest.raises(HarnessError, match="need 2 GPU\\(s\\) per node and this node has 1"):
        check_nodes(plan, 1, 0, None, gpus=1)
    check_nodes(plan, 2, 0, "h:1", gpus=1)
    check_nodes(plan, 1, 0, None, gpus=2)
    out = tmp_path / "never"
    code = main(["bench", "--device", "cpu", "--nnodes", "2", "--out", str(out)])
    err = capsys.readouterr().err
    assert code == 2 and "do not split evenly" in err and len(err.strip().splitlines()) == 1
    assert not out.exists()

"""ZeRO offload's CPU optimizer step gets the rank's share of the node's cores.

Several ranks on a node run with OMP_NUM_THREADS=1 (torchrun's default, and our
launcher's); under offload each rank's AdamW over its shard runs on the host, so
one thread each would leave most cores idle while the GPUs wait.
"""

from __future__ import annotations

import pytest

from training_harness.strategies.zero import offload_threads


@pytest.mark.parametrize(("cores", "ranks", "threads"), [
    (16, 1, 16), (16, 8, 2), (16, 3, 5), (4, 8, 1), (2, 0, 2),
])
def test_offload_gives_each_rank_its_share_of_the_cores(cores, ranks, threads):
    assert offload_threads(cores, ranks) == threads

"""CPU thread settings per engine process, so that several engines on one
machine do not spin their OpenMP pools against each other on shared cores.

torch's intra-op pool is per process: a child-process engine (mp mode) gets
its own ``num_threads``; in-process engines share the caller's setting.
"""

from __future__ import annotations

import os


def apply_process_threads(num_threads: int | None) -> None:
    if num_threads is None:
        return
    import torch

    os.environ["OMP_NUM_THREADS"] = str(num_threads)
    torch.set_num_threads(num_threads)

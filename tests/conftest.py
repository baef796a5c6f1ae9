import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# One engine-core process per vLLM engine, no extra worker process: starts in half the time.
os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")

import torch  # noqa: E402

# Two OpenMP threads on two shared cores made tiny forwards ~30x slower.
torch.set_num_threads(1)

pytest_plugins = ["omnistage.testing.fixtures"]


def pytest_collection_modifyitems(config, items):
    """The slowest modules first (tests/slow_modules.txt, scripts/suite_order.py), the rest in collection order:
    with ``--dist loadfile --no-loadscope-reorder`` (make test) the two workers then end close together."""
    from pathlib import Path

    listed = Path(__file__).with_name("slow_modules.txt").read_text().splitlines()
    rank = {line.split("#")[0].strip(): i for i, line in enumerate(listed) if line.split("#")[0].strip()}
    items.sort(key=lambda item: rank.get(item.nodeid.split("::")[0], len(rank)))  # (stable: keeps the rest's order)


def pytest_collection_finish(session):
    """The GPU-profile pip dry run waits on the network for minutes: it starts now, in the background, and its
    test reads the result (tests/gpu_profile.py)."""
    from tests import gpu_profile

    if any(item.nodeid == gpu_profile.TEST for item in session.items):
        gpu_profile.start()

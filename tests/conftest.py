import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# One engine-core process per vLLM engine, no extra worker process: starts in half the time.
os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")

import torch  # noqa: E402

# Two OpenMP threads on two shared cores made tiny forwards ~30x slower.
torch.set_num_threads(1)

pytest_plugins = ["omnistage.testing.fixtures"]

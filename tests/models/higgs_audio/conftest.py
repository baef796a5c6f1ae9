"""Shared by the higgs_audio tests: the tiny folder; transformers' own ``generate`` as the LM's reference (the
text prompt rendered and tokenized as ``HiggsAudioV2Processor`` does); the goldens of what cannot run here.

transformers' audio tokenizer model (and so the processor holding it) imports torchaudio, which has no build
for this torch: its decode / encode and the processor's voice-cloning prompts ran in a separate environment,
``scripts/reference/higgs_audio/setup.sh`` (under a minute; the venv lives outside the repo), which builds the
same tiny folder and writes ``golden/``. ``golden/weights.json`` holds the sha256 of the weights the goldens
came from; the ``higgs_dir`` fixture checks this session's tiny build against it (a different build means:
rerun the script).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
import torch

GOLDEN = Path(__file__).parent / "golden"


def golden(name: str) -> dict[str, np.ndarray]:
    return dict(np.load(GOLDEN / f"{name}.npz"))


@pytest.fixture(scope="session")
def higgs_dir(tiny_model):
    folder = tiny_model("higgs_audio")
    for name, digest in json.loads((GOLDEN / "weights.json").read_text()).items():
        assert hashlib.sha256((folder / name).read_bytes()).hexdigest() == digest, (
            f"{name} differs from the weights the goldens came from: rerun scripts/reference/higgs_audio/setup.sh"
        )
    return folder


def conversation(text: str, scene: str | None = None) -> list[dict]:
    messages = [{"role": "system", "content": "Generate audio following instruction."}]
    if scene:
        messages.append({"role": "scene", "content": scene})
    return [*messages, {"role": "user", "content": text}]


@dataclass
class Generated:
    rows: torch.Tensor  # [steps, N] the delayed rows generate returned
    codes: torch.Tensor  # [frames, N] what the processor decodes: between the BOS and EOS rows, un-delayed, clipped


class TransformersReference:
    def __init__(self, folder):
        from transformers import AutoTokenizer, HiggsAudioV2ForConditionalGeneration

        self.model = HiggsAudioV2ForConditionalGeneration.from_pretrained(str(folder), dtype=torch.float32).eval()
        self.tokenizer = AutoTokenizer.from_pretrained(str(folder))
        self.template = (folder / "chat_template.jinja").read_text()
        self._cache: dict = {}

    def run(self, messages: list[dict], steps: int, seed: int | None = None, **sampling) -> Generated:
        """Greedy unless ``sampling`` says otherwise; ``seed`` seeds the global generator first (sampling and
        the repetition-aware redraws draw from it)."""
        from transformers import HiggsAudioV2Processor

        key = (repr(messages), steps, seed, tuple(sorted(sampling.items())))
        if key not in self._cache:
            text = self.tokenizer.apply_chat_template(
                messages, chat_template=self.template, tokenize=False, add_generation_prompt=True
            )
            inputs = self.tokenizer([text], return_tensors="pt")
            if seed is not None:
                torch.manual_seed(seed)
            with torch.no_grad():
                rows = self.model.generate(**inputs, max_new_tokens=steps, **({"do_sample": False} | sampling))[0]
            cfg = self.model.config
            start = int((rows == cfg.audio_stream_bos_id).all(-1).nonzero()[-1, 0])
            ends = (rows[start:] == cfg.audio_stream_eos_id).all(-1).nonzero()
            end = start + int(ends[0, 0]) if len(ends) else rows.shape[0]
            # the processor's own un-delaying (it reads nothing of the processor's state)
            codes = HiggsAudioV2Processor.revert_delay_pattern(None, rows[start + 1 : end])
            self._cache[key] = Generated(rows, codes.clip(0, cfg.audio_stream_bos_id - 1))
        return self._cache[key]


@pytest.fixture(scope="session")
def reference(higgs_dir):
    return TransformersReference(higgs_dir)

"""Shared by the xtts tests: the tiny folder and the goldens of coqui-tts 0.28.0 (the authors' package) run on it.

coqui-tts imports torchaudio (no build for this torch) and needs packages the project does not use, so it ran
in a separate environment: ``scripts/reference/xtts/setup.sh`` (a venv under /work/ref-venvs that sees the
project's torch and transformers; the script builds the tiny folder as ``python -m omnistage.testing.tiny
xtts`` does and runs ``run_reference.py``, which loads it with the release's own ``Xtts.load_checkpoint``,
strict, and runs every call twice: the same bytes both times; then ``frontend_goldens.py``, the release's sentence
splitting and speech through its text front end). ``golden/weights.json`` holds the sha256 of
the files the goldens came from; ``xtts_dir`` checks this session's tiny build against it (a different build
means: rerun the script).
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import pytest

GOLDEN = Path(__file__).parent / "golden"
# the goldens' requests (run_reference.py's CASES): text, language, the stage-0 params meaning the same
CASES = {
    "greedy_en": ("Hello there, how are you?", "en", {"temperature": 0}, 1.0),
    "sampled_en": ("Hello there, how are you?", "en", {"seed": 1234}, 1.0),
    "greedy_es": ("hola, buenos dias amigo.", "es", {"temperature": 0}, 1.0),
    "slow_en": ("the weather is fine.", "en", {"temperature": 0}, 0.8),
}
# run_reference.py's STREAMS: inference_stream samples at the checkpoint's settings with this seed
STREAMS = {"en_seed1234": ("sampled_en", 1234, 2), "es_seed0": ("greedy_es", 0, 8)}
# frontend_goldens.py's SPEECH (greedy, as CASES' greedy ones): name -> (text, language, enable_text_splitting)
FRONTEND = {
    "price_en": ("It costs $5.50, 20% off.", "en", False),
    "zh": ("你好，价格是5元。", "zh-cn", False),
    "ja": ("今日はいい天気ですね。", "ja", False),
    "split_ja": ("今日は。" * 9 + "明日は雨が降るでしょう。" * 4, "ja", True),  # 84 characters: two pieces
}
FRONTEND_STREAM = ("split_ja", 3, 0)  # its inference_stream: the FRONTEND text, stream_chunk_size, seed
STEP = 1  # one 16-bit step: the tolerance of every waveform (the goldens are PCM16; measured: at most 1)


def golden(name: str) -> dict[str, np.ndarray]:
    return dict(np.load(GOLDEN / f"{name}.npz"))


def stream_pieces(name: str, prefix: str = "stream") -> list[np.ndarray]:
    g = golden(f"{prefix}_{name}")
    return [g[f"piece{i}"] for i in range(len(g))]


def text_ids() -> dict[str, list[int]]:
    return json.loads((GOLDEN / "text.json").read_text())


def pcm(audio) -> np.ndarray:
    """float audio -> 16-bit PCM as run_reference.py writes it."""
    return (np.clip(np.asarray(audio, dtype=np.float32), -1, 1) * 32767).astype(np.int16)


def within_one_step(audio, ref: np.ndarray) -> None:
    got = pcm(audio) if np.asarray(audio).dtype != np.int16 else np.asarray(audio)
    assert got.shape == ref.shape
    assert np.abs(got.astype(np.int32) - ref.astype(np.int32)).max() <= STEP
    assert np.abs(ref).max() > 1000  # not silence: the comparison means something


@pytest.fixture(scope="session")
def xtts_dir(tiny_model):
    folder = tiny_model("xtts")
    for name, digest in json.loads((GOLDEN / "weights.json").read_text()).items():
        assert hashlib.sha256((folder / name).read_bytes()).hexdigest() == digest, (
            f"{name} differs from the files the goldens came from: rerun scripts/reference/xtts/setup.sh"
        )
    return folder


@pytest.fixture(scope="session")
def clip():
    from omnistage.models.xtts.tiny import reference_clip

    return reference_clip(), 22050

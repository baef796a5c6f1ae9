"""Shared by the qwen3_tts tests: the tiny checkpoints and the goldens of the reference package.

Both come from ``qwen-tts`` 0.1.1 in its own environment: ``scripts/reference/qwen3_tts/setup.sh`` builds
the venv, the tiny CustomVoice / VoiceDesign / Base checkpoints (1.7B layout) and a 0.6B-layout CustomVoice
(``tiny/``, committed: see make_tiny.py for why) and the goldens (``golden/``: per case the greedy codes
[frames, G], the waveform, the text ids). Regenerate with ``scripts/reference/qwen3_tts/setup.sh`` (about
5 min; the venv lives outside the repo). A rerun on another machine (2026-12-02, when the 0.6B case was
added) rebuilt the 1.7B checkpoints byte for byte and their goldens with identical codes and waveforms within
3.6e-6 (CPU kernel rounding); the committed ones were kept.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

HERE = Path(__file__).parent
TINY = HERE / "tiny"
GOLDEN = HERE / "golden"
CASES = {c["name"]: c for c in json.loads((GOLDEN / "cases.json").read_text())["cases"]}
REF_CLIP = np.load(GOLDEN / "ref_clip.npz")["wav"]
# the reference ran greedy with repetition penalty 1 and 12 talker tokens (11 frames)
GREEDY = {"temperature": 0, "repetition_penalty": 1.0, "max_tokens": 12}


def golden(name: str) -> dict[str, np.ndarray]:
    return dict(np.load(GOLDEN / f"{name}.npz"))


def prompt_of(name: str) -> dict:
    """The omnistage request of a reference case (``qwen-tts`` arguments -> prompt + speech input)."""
    case = CASES[name]
    args = case["args"]
    info = {"language": args.get("language")}
    if "speaker" in args:
        info["voice"] = args["speaker"]
    if "instruct" in args:
        info["instructions"] = args["instruct"]
    if "non_streaming_mode" in args:
        info["non_streaming_mode"] = args["non_streaming_mode"]
    if case["kind"] == "base":
        info["ref_audio"] = (REF_CLIP, 24000)
        if args.get("x_vector_only_mode"):
            info["x_vector_only_mode"] = True
        else:
            info["ref_text"] = args["ref_text"]
    return {"prompt": args["text"], "speech": info}


def names(kind: str) -> list[str]:
    return [n for n, c in CASES.items() if c["kind"] == kind]


@pytest.fixture(scope="session")
def tiny():
    return {kind: TINY / kind for kind in ("custom_voice", "voice_design", "base", "custom_voice_0b6")}

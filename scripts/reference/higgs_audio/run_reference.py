"""Goldens for omnistage's higgs_audio tests: transformers' Higgs Audio v2 audio tokenizer and processor
(``HiggsAudioV2TokenizerModel``, ``HiggsAudioV2Processor``, which need torchaudio) on the tiny folder, run
in the reference venv that ``setup.sh`` builds.

    HF_HUB_OFFLINE=1 /work/refvenv/higgs_audio/bin/python run_reference.py TINY_DIR GOLDEN_DIR

Writes GOLDEN_DIR/decode.npz (seeded random codes [N, T] and the tokenizer's ``decode`` of them),
GOLDEN_DIR/clone.npz (a reference clip, torchaudio's resampling of it to 16 kHz, its ``encode`` codes, and ``generate`` greedy on the processor's
prompt of a voice-cloning conversation: the delayed rows, the processor's decode of them, the prompt ids),
GOLDEN_DIR/plain.npz (the same without the clip: rows and decode) and GOLDEN_DIR/weights.json (sha256 of the weight files the goldens came from: the tests check their own
tiny build against it). Every case runs twice and must be bit-identical.
"""

import hashlib
import json
import os
import sys
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
import numpy as np
import torch
import torchaudio
from transformers import (
    AutoTokenizer,
    DacFeatureExtractor,
    HiggsAudioV2ForConditionalGeneration,
    HiggsAudioV2Processor,
    HiggsAudioV2TokenizerModel,
)

SYSTEM = "Generate audio following instruction."
REF_TEXT = "a clip of my voice."
TEXT = "hello there, how are you today?"
STEPS = 16


def clip(seconds: float = 1.3, rate: int = 24000) -> np.ndarray:
    """The reference clip: a pitched tone with noise, mono float32."""
    rng = np.random.default_rng(0)
    t = np.arange(int(seconds * rate)) / rate
    return (0.3 * np.sin(2 * np.pi * 180 * t) + 0.05 * rng.standard_normal(t.size)).astype(np.float32)


def run(tiny: Path) -> dict:
    audio_tokenizer = HiggsAudioV2TokenizerModel.from_pretrained(str(tiny / "audio_tokenizer")).eval()
    processor = HiggsAudioV2Processor(
        feature_extractor=DacFeatureExtractor.from_pretrained(str(tiny)),
        tokenizer=AutoTokenizer.from_pretrained(str(tiny)),
        audio_tokenizer=audio_tokenizer,
        chat_template=(tiny / "chat_template.jinja").read_text(),
    )
    model = HiggsAudioV2ForConditionalGeneration.from_pretrained(str(tiny), dtype=torch.float32).eval()
    out = {}
    g = torch.Generator().manual_seed(0)
    codes = torch.randint(
        0, audio_tokenizer.config.codebook_size, (audio_tokenizer.config.num_quantizers, 40), generator=g
    )
    with torch.no_grad():
        out["decode_codes"] = codes.numpy()
        out["decode_wav"] = audio_tokenizer.decode(codes.unsqueeze(0)).audio_values[0, 0].numpy()
        wav = clip()
        out["clip"] = wav
        out["clip_16k"] = torchaudio.functional.resample(torch.from_numpy(wav), 24000, 16000).numpy()
        out["clip_codes"] = audio_tokenizer.encode(torch.from_numpy(wav).view(1, 1, -1)).audio_codes[0].numpy()
        conversation = [
            {"role": "system", "content": [{"type": "text", "text": SYSTEM}]},
            {"role": "user", "content": [{"type": "text", "text": REF_TEXT}]},
            {"role": "assistant", "content": [{"type": "audio", "audio": wav}]},
            {"role": "user", "content": [{"type": "text", "text": TEXT}]},
        ]
        inputs = processor.apply_chat_template(
            conversation,
            tokenize=True,
            return_dict=True,
            add_generation_prompt=True,
            sampling_rate=24000,
            return_tensors="pt",
        )
        rows = model.generate(**inputs, max_new_tokens=STEPS, do_sample=False, ras_win_len=None)
        out["clone_prompt_ids"] = inputs["input_ids"][0].numpy()
        out["clone_prompt_audio"] = inputs["audio_input_ids"][0].numpy()
        out["clone_rows"] = rows[0].numpy()
        out["clone_wav"] = processor.decode(rows).numpy()
        plain = processor.apply_chat_template(
            [conversation[0], conversation[3]],
            tokenize=True,
            return_dict=True,
            add_generation_prompt=True,
            return_tensors="pt",
        )
        rows = model.generate(**plain, max_new_tokens=STEPS, do_sample=False, ras_win_len=None)
        out["plain_rows"] = rows[0].numpy()
        out["plain_wav"] = processor.decode(rows).numpy()
    return out


def main() -> None:
    tiny, golden = Path(sys.argv[1]), Path(sys.argv[2])
    torch.set_num_threads(1)
    a, b = run(tiny), run(tiny)
    for k in a:
        assert np.array_equal(a[k], b[k]), f"{k} differs between two runs"
    golden.mkdir(parents=True, exist_ok=True)
    np.savez(golden / "decode.npz", codes=a["decode_codes"], wav=a["decode_wav"])
    np.savez(
        golden / "clone.npz",
        clip=a["clip"],
        clip_16k=a["clip_16k"],
        clip_codes=a["clip_codes"],
        prompt_ids=a["clone_prompt_ids"],
        prompt_audio=a["clone_prompt_audio"],
        rows=a["clone_rows"],
        wav=a["clone_wav"],
        ref_text=np.array(REF_TEXT),
        text=np.array(TEXT),
        steps=np.array(STEPS),
    )
    np.savez(golden / "plain.npz", rows=a["plain_rows"], wav=a["plain_wav"], text=np.array(TEXT), steps=np.array(STEPS))
    weights = {
        str(p.relative_to(tiny)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(tiny.rglob("*.safetensors"))
    }
    (golden / "weights.json").write_text(json.dumps(weights, indent=2) + "\n")
    print({k: v.shape for k, v in a.items()})


if __name__ == "__main__":
    main()

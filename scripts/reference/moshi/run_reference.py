"""Run the authors' step loop (moshi 0.2.13) on the tiny checkpoint and write the goldens the tests compare with.

    python run_reference.py TINY_DIR GOLDEN_DIR

What ``moshi.server`` does per 80 ms frame, for one conversation: Mimi encodes the user's 1920 samples (streaming)
into 8 codes, ``LMGen.step`` runs one temporal step and the depth transformer (greedy: ``use_sampling=False``),
and once the delay pattern lets a frame out, Mimi decodes the model's 8 codes (streaming) into 1920 samples.
Each case is one session fed a fixed signal; GOLDEN_DIR/<case>.npz holds ``user_pcm`` [T * 1920] (float32),
``user_codes`` [T, 8], ``tokens`` [T - 1, 9] (the text token then the 8 audio codes of each output frame) and
``pcm`` [(T - 1) * 1920] (the decoded output) and ``text`` (the transcript moshi.server sends).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import sentencepiece
import torch
from moshi.models import LMGen, loaders

CASES = {"a": (0, 20), "b": (1, 20), "c": (2, 14), "d": (3, 24)}  # name: (signal seed, frames); greedy
# a sampled case: the authors' LMGen draws from torch's global generator (text token, then the 8 codes, per step)
SAMPLED = {
    "name": "s",
    "signal": 4,
    "frames": 16,
    "seed": 1234,
    "temp": 0.8,
    "temp_text": 0.7,
    "top_k": 20,
    "top_k_text": 10,
}
FRAME = 1920


def user_signal(seed: int, frames: int) -> np.ndarray:
    """A fixed input: a few drifting tones under noise, in [-1, 1]."""
    rng = np.random.default_rng(seed)
    t = np.arange(frames * FRAME) / 24000
    tones = sum(
        rng.uniform(0.05, 0.2) * np.sin(2 * np.pi * rng.uniform(100, 900) * t * (1 + 0.1 * t)) for _ in range(3)
    )
    x = tones + 0.05 * rng.standard_normal(t.shape)
    return (np.round(x * 32768) / 32768).astype(np.float32)  # on the 16-bit grid: PCM16 over the wire is exact


@torch.no_grad()
def run_case(mimi, lm, pcm: np.ndarray, tokenizer, sampling: dict | None = None) -> dict[str, np.ndarray]:
    if sampling is None:
        lm_gen = LMGen(lm, use_sampling=False, temp=0.0, temp_text=0.0)
    else:
        keys = ("temp", "temp_text", "top_k", "top_k_text")
        lm_gen = LMGen(lm, use_sampling=True, **{k: sampling[k] for k in keys})
        torch.manual_seed(sampling["seed"])
    user_codes, tokens, out_pcm, text = [], [], [], []
    with mimi.streaming(1), lm_gen.streaming(1):
        for start in range(0, len(pcm), FRAME):
            chunk = torch.from_numpy(pcm[start : start + FRAME]).view(1, 1, FRAME)
            codes = mimi.encode(chunk)  # [1, 8, 1]
            user_codes.append(codes[0, :, 0].numpy())
            out = lm_gen.step(codes)
            if out is None:  # the first step only fills the delay pattern
                continue
            tokens.append(out[0, :, 0].numpy())
            token = int(out[0, 0, 0])
            if token not in (0, 3):  # moshi.server's transcript: each non-padding piece, "▁" as a space
                text.append(tokenizer.id_to_piece(token).replace("\u2581", " "))
            out_pcm.append(mimi.decode(out[:, 1:])[0, 0].numpy())
    return {
        "user_pcm": pcm,
        "user_codes": np.stack(user_codes).astype(np.int64),
        "tokens": np.stack(tokens).astype(np.int64),
        "pcm": np.concatenate(out_pcm).astype(np.float32),
        "text": np.array("".join(text)),
    }


def main(tiny: str, golden: str) -> None:
    torch.manual_seed(0)
    torch.set_num_threads(1)
    folder, out = Path(tiny), Path(golden)
    out.mkdir(parents=True, exist_ok=True)
    config = json.loads((folder / "config.json").read_text())
    lm_kwargs = {
        k: v
        for k, v in config.items()
        if not k.endswith("_name") and k != "model_type" and not k.startswith("persona_")
    }
    mimi_config = json.loads((folder / config["mimi_config_name"]).read_text())
    mimi = loaders.get_mimi(folder / config["mimi_name"], mimi_config, num_codebooks=8)  # strict load: every key
    lm = loaders.get_moshi_lm(folder / config["moshi_name"], lm_kwargs=lm_kwargs, dtype=torch.float32)
    missing = lm.load_state_dict(loaders.load_file(folder / config["moshi_name"]), strict=True)
    assert not missing.missing_keys and not missing.unexpected_keys
    tokenizer = sentencepiece.SentencePieceProcessor(model_file=str(folder / config["tokenizer_name"]))
    for name, (seed, frames) in CASES.items():
        result = run_case(mimi, lm, user_signal(seed, frames), tokenizer)
        np.savez_compressed(out / f"{name}.npz", **result)
        print(name, "text", result["tokens"][:, 0].tolist())
        print(name, "codes[0]", result["tokens"][:, 1].tolist(), repr(str(result["text"])))
    result = run_case(mimi, lm, user_signal(SAMPLED["signal"], SAMPLED["frames"]), tokenizer, SAMPLED)
    np.savez_compressed(out / "s.npz", **result)
    (out / "sampled.json").write_text(json.dumps(SAMPLED, indent=1) + "\n")
    print("s text", result["tokens"][:, 0].tolist())


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])

"""Goldens for omnistage's voxcpm tests: OpenBMB's ``voxcpm`` 2.0.3 (``VoxCPM`` and ``VoxCPM2Model``) on the tiny
folder, run in the reference venv that ``setup.sh`` builds.

    HF_HUB_OFFLINE=1 /work/ref-venvs/voxcpm/bin/python run_reference.py TINY_DIR GOLDEN_DIR

Three cases, each seeded with ``torch.manual_seed`` right before the call (the release draws the local DiT's
noise from the global generator): ``plain`` (text only), ``clone`` (a clip and its transcript: the release's
continuation mode, ``prompt_wav_path`` + ``prompt_text``) and ``reference`` (a clip alone:
``reference_wav_path``). Each writes GOLDEN_DIR/<case>.npz: ``whole`` (``VoxCPM.generate``'s waveform),
``stream`` (``VoxCPM.generate_streaming``'s chunks joined), ``feats`` (the generated latent patches
[T, P, D], from ``VoxCPM2Model.generate_with_prompt_cache``, whose waveform must equal ``whole`` bit for bit)
and the inputs (text, clip, clip text, seed). GOLDEN_DIR/weights.json holds the sha256 of the weight files.
Every case runs twice and must be bit-identical.
"""

import hashlib
import json
import os
import sys
import tempfile
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
import numpy as np
import soundfile as sf
import torch
from safetensors.torch import load_file
from voxcpm import VoxCPM

TEXT = "hello world, this is a tiny speech model."
CLIP_TEXT = "voice cloning from a clip."
STEPS = 10  # the release's default inference_timesteps
CFG = 2.0  # the release's default cfg_value


def clip(seconds: float = 0.4, rate: int = 16000) -> np.ndarray:
    """The reference clip: a pitched tone with noise, mono float32 at the VAE's input rate."""
    rng = np.random.default_rng(0)
    t = np.arange(int(seconds * rate)) / rate
    x = 0.3 * np.sin(2 * np.pi * 220 * t) + 0.1 * np.sin(2 * np.pi * 660 * t) + 0.02 * rng.standard_normal(t.size)
    return x.astype(np.float32)


def check_keys(tts, folder: Path) -> None:
    """The release loads with strict=False: every parameter it has must come from the tiny files."""
    keys = set(load_file(str(folder / "model.safetensors")))
    keys |= {f"audio_vae.{k}" for k in load_file(str(folder / "audiovae.safetensors"))}
    missing = [k for k in tts.state_dict() if k not in keys]
    assert not missing, f"the reference has parameters the tiny folder lacks: {missing[:5]}"


def run(model: VoxCPM, case: str, wav: str, seed: int) -> dict[str, np.ndarray]:
    kwargs = {"cfg_value": CFG, "inference_timesteps": STEPS, "retry_badcase": False}
    if case == "clone":
        kwargs.update(prompt_wav_path=wav, prompt_text=CLIP_TEXT)
    elif case == "reference":
        kwargs.update(reference_wav_path=wav)
    torch.manual_seed(seed)
    whole = model.generate(TEXT, **kwargs)
    torch.manual_seed(seed)
    stream = np.concatenate(list(model.generate_streaming(TEXT, **kwargs)))
    tts = model.tts_model
    cache = None
    if case != "plain":
        cache = tts.build_prompt_cache(
            prompt_text=kwargs.get("prompt_text"),
            prompt_wav_path=kwargs.get("prompt_wav_path"),
            reference_wav_path=kwargs.get("reference_wav_path"),
        )
    torch.manual_seed(seed)
    audio, _, feats = tts.generate_with_prompt_cache(
        TEXT, cache, inference_timesteps=STEPS, cfg_value=CFG, max_len=4096, retry_badcase=False
    )
    assert np.array_equal(audio.squeeze(0).numpy(), whole), f"{case}: the model-level call differs from VoxCPM.generate"
    return {"whole": whole, "stream": stream, "feats": feats.numpy(), "seed": np.int64(seed)}


def main(tiny: str, out: str) -> None:
    folder, golden = Path(tiny), Path(out)
    golden.mkdir(parents=True, exist_ok=True)
    model = VoxCPM(voxcpm_model_path=str(folder), enable_denoiser=False, optimize=False, device="cpu")
    check_keys(model.tts_model, folder)
    samples = clip()
    with tempfile.TemporaryDirectory() as tmp:
        wav = str(Path(tmp) / "clip.wav")
        sf.write(wav, samples, 16000, subtype="FLOAT")
        for seed, case in enumerate(["plain", "clone", "reference"]):
            first, again = run(model, case, wav, seed), run(model, case, wav, seed)
            for k in first:
                assert np.array_equal(first[k], again[k]), f"{case}/{k} differs between two runs"
            np.savez(golden / f"{case}.npz", **first, text=np.str_(TEXT), clip=samples, clip_text=np.str_(CLIP_TEXT))
            print(case, {k: v.shape for k, v in first.items()})
    digests = {
        n: hashlib.sha256((folder / n).read_bytes()).hexdigest() for n in ("model.safetensors", "audiovae.safetensors")
    }
    (golden / "weights.json").write_text(json.dumps(digests, indent=2) + "\n")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])

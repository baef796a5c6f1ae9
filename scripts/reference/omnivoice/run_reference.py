"""Goldens for omnistage's omnivoice tests: ``omnivoice.OmniVoice.generate`` (k2-fsa's package) on the tiny
checkpoint, run in the reference venv that ``setup.sh`` builds.

    HF_HUB_OFFLINE=1 /work/refvenv/omnivoice/bin/python run_reference.py TINY_DIR GOLDEN_DIR

One ``<case>.npz`` per case: the request (text, language, instruct, seed, duration, num_step), the prompt's
text-row ids, the target length in frames, the generated codes [8, T] and the waveform ``generate`` returns.
The clone case adds the reference clip, its transcript, the clip's codes (``create_voice_clone_prompt``:
the audio tokenizer's encode after the package's silence trimming) and its RMS. Each case is computed from the package's own steps
(``_preprocess_all`` -> ``_generate_iterative`` -> ``_decode_and_post_process``, so the codes are kept) and
checked bit-equal to ``generate`` itself under the same seed. ``silence.npz``: the package's silence trimming
on noise with silent gaps (``silence_golden``).
"""

import sys
from pathlib import Path

import numpy as np
import torch
from omnivoice import OmniVoice, OmniVoiceGenerationConfig
from omnivoice.utils.audio import remove_silence

REF_TEXT = "a clip of my voice."
CASES = {
    "auto": dict(text="hello there, how are you today?", language="en", seed=0),
    "design": dict(text="the sun rises in the east.", language="English", instruct="female, low pitch", seed=1),
    "duration": dict(text="hello there.", language=None, seed=2, duration=1.2, num_step=8),
    "clone": dict(text="how are you today?", language="en", seed=3, clone=True),
}


def clip(seconds: float = 1.3, rate: int = 24000) -> np.ndarray:
    """The reference clip: a pitched tone with noise and a silent gap, mono float32."""
    rng = np.random.default_rng(0)
    t = np.arange(int(seconds * rate)) / rate
    wav = 0.3 * np.sin(2 * np.pi * 180 * t) + 0.05 * rng.standard_normal(t.size)
    wav[int(0.5 * rate) : int(0.8 * rate)] = 0.0
    return wav.astype(np.float32)


@torch.inference_mode()  # as generate runs them
def run_case(model: OmniVoice, case: dict) -> dict:
    cfg = OmniVoiceGenerationConfig(num_step=case.get("num_step", 32))
    kw = dict(
        text=case["text"],
        language=case.get("language"),
        instruct=case.get("instruct"),
        duration=case.get("duration"),
    )
    out = {}
    if case.get("clone"):
        # the clip's prompt is made before seeding: the audio tokenizer's encode draws from the global
        # generator, which would shift the unmasking noise by an amount no other implementation shares
        ref = clip()
        kw["voice_clone_prompt"] = model.create_voice_clone_prompt((torch.from_numpy(ref), 24000), REF_TEXT)
        out["ref_audio"] = ref
        out["ref_text"] = np.array(REF_TEXT)
    torch.manual_seed(case["seed"])
    task = model._preprocess_all(preprocess_prompt=cfg.preprocess_prompt, **kw)
    codes = model._generate_iterative(task, cfg)[0]
    wav = model._decode_and_post_process(codes, task.ref_rms[0], cfg)
    torch.manual_seed(case["seed"])
    whole = model.generate(generation_config=cfg, **kw)[0]
    assert np.array_equal(whole, wav), "the package's steps differ from its generate"
    inputs = model._prepare_inference_inputs(
        task.texts[0],
        task.target_lens[0],
        task.ref_texts[0],
        task.ref_audio_tokens[0],
        task.langs[0],
        task.instructs[0],
        cfg.denoise,
    )
    out.update(
        text=np.array(case["text"]),
        language=np.array(case.get("language") or ""),
        instruct=np.array(case.get("instruct") or ""),
        seed=np.array(case["seed"]),
        duration=np.array(case.get("duration") or 0.0),
        num_step=np.array(cfg.num_step),
        prompt_ids=inputs["input_ids"][0, 0].numpy(),
        target_len=np.array(task.target_lens[0]),
        codes=codes.numpy(),
        audio=wav.astype(np.float32),
    )
    if case.get("clone"):
        out["ref_codes"] = task.ref_audio_tokens[0].numpy()
        out["ref_rms"] = np.array(task.ref_rms[0])
        out["ref_text_used"] = np.array(task.ref_texts[0])
    return out


def silence_golden(golden: Path, rate: int = 24000) -> None:
    """``silence.npz``: the package's silence trimming (as ``generate`` calls it) on noise of several levels
    with silent and near-silent gaps, the cases a random tiny model's speech never reaches. In and out are
    16-bit samples (the trimming works at 16 bits, so nothing is lost)."""
    rng = np.random.default_rng(0)
    out = {}
    for i in range(6):
        n = int(rng.integers(100, 50000))
        x = rng.standard_normal(n) * rng.uniform(0.001, 0.3)
        for _ in range(int(rng.integers(1, 4))):
            a = int(rng.integers(0, n))
            x[a : a + int(rng.integers(0, 30000))] *= rng.choice([0.0, 1e-4, 2e-3])
        pcm = (x * 32768).clip(-32768, 32767).astype(np.int16)
        trimmed = remove_silence(pcm[None].astype(np.float32) / 32768.0, rate, mid_sil=500, lead_sil=100, trail_sil=100)
        out[f"in{i}"] = pcm
        out[f"out{i}"] = np.round(trimmed[0] * 32768.0).astype(np.int16)
    np.savez_compressed(golden / "silence.npz", **out)


def main(tiny: Path, golden: Path) -> None:
    model = OmniVoice.from_pretrained(str(tiny), dtype=torch.float32).eval()
    golden.mkdir(parents=True, exist_ok=True)
    for name, case in CASES.items():
        first = run_case(model, case)
        again = run_case(model, case)
        for k in first:
            assert np.array_equal(first[k], again[k]), f"{name}.{k} differs between two runs"
        np.savez(golden / f"{name}.npz", **first)
        print(name, "frames", int(first["target_len"]), "samples", first["audio"].size)
    silence_golden(golden)


if __name__ == "__main__":
    main(Path(sys.argv[1]), Path(sys.argv[2]))

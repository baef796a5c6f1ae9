"""Run coqui-tts 0.28.0's XTTS v2 on the tiny folder and write the goldens the xtts tests compare with.

    python run_reference.py TINY_DIR GOLDEN_DIR

Loads the folder with the release's own ``Xtts.load_checkpoint`` (strict: every key of ``model.pth`` must fit
the release's modules) and writes, for the tiny clip (``omnistage.models.xtts.tiny.reference_clip``):
``conditioning.npz`` (``get_gpt_cond_latents`` / ``get_speaker_embedding``, the body of
``get_conditioning_latents`` without its file decode), ``text.json`` (``VoiceBpeTokenizer.encode`` ids),
``whole_*.npz`` (``Xtts.inference``: codes and 16-bit PCM), ``stream_*.npz`` (``Xtts.inference_stream``:
each streamed piece as 16-bit PCM) and ``weights.json`` (sha256 of the files it loaded). Every call runs
twice and must give the same bytes both times.
"""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path

import numpy as np
import torch

CASES = {  # name -> (text, language, inference settings); greedy is do_sample=False, the rest are seeded
    "greedy_en": ("Hello there, how are you?", "en", {"do_sample": False}),
    "sampled_en": ("Hello there, how are you?", "en", {"do_sample": True, "seed": 1234}),
    "greedy_es": ("hola, buenos dias amigo.", "es", {"do_sample": False}),
    "slow_en": ("the weather is fine.", "en", {"do_sample": False, "speed": 0.8}),
}
# name -> (case, seed, stream_chunk_size): inference_stream always samples (it draws even with do_sample=False)
STREAMS = {"en_seed1234": ("sampled_en", 1234, 2), "es_seed0": ("greedy_es", 0, 8)}


def pcm(wav) -> np.ndarray:
    return (np.clip(np.asarray(wav, dtype=np.float32), -1, 1) * 32767).astype(np.int16)


def run_twice(fn):
    first, second = fn(), fn()
    for a, b in zip(first, second):
        assert np.array_equal(a, b), "the reference is not deterministic"
    return first


def load_model(tiny: Path):
    """The release's ``Xtts`` on the tiny folder, every key loaded (strict), on one thread."""
    from TTS.tts.configs.xtts_config import XttsConfig
    from TTS.tts.models.xtts import Xtts

    torch.set_num_threads(1)
    config = XttsConfig()
    config.load_json(str(tiny / "config.json"))
    model = Xtts(config)
    model.load_checkpoint(config, checkpoint_dir=str(tiny), eval=True, strict=True)
    model.eval()
    return model


def main(tiny: Path, out: Path) -> None:
    from omnistage.models.xtts.tiny import reference_clip

    model = load_model(tiny)
    config = model.config
    out.mkdir(parents=True, exist_ok=True)

    audio = torch.from_numpy(reference_clip()).reshape(1, -1).clip(-1, 1)  # 22.05 kHz, as load_audio returns it
    speaker = model.get_speaker_embedding(audio, 22050)
    speaker = torch.stack([speaker]).mean(dim=0)
    cond = model.get_gpt_cond_latents(audio, 22050, length=config.gpt_cond_len, chunk_length=config.gpt_cond_chunk_len)
    np.savez(out / "conditioning.npz", cond=cond[0].numpy(), speaker=speaker[0].numpy())

    texts = {name: model.tokenizer.encode(text.strip().lower(), lang=lang) for name, (text, lang, _) in CASES.items()}
    (out / "text.json").write_text(json.dumps(texts, indent=1) + "\n")

    settings = {k: config[k] for k in ("temperature", "length_penalty", "repetition_penalty", "top_k", "top_p")}
    for name, (text, lang, extra) in CASES.items():
        extra = dict(extra)
        seed = extra.pop("seed", 0)

        def whole(name=name, text=text, lang=lang, extra=extra, seed=seed):
            torch.manual_seed(seed)
            codes = model.gpt.generate(
                cond_latents=cond,
                text_inputs=torch.IntTensor(texts[name]).unsqueeze(0),
                top_p=settings["top_p"],
                top_k=settings["top_k"],
                temperature=settings["temperature"],
                num_return_sequences=1,
                num_beams=1,
                length_penalty=settings["length_penalty"],
                repetition_penalty=settings["repetition_penalty"],
                output_attentions=False,
                do_sample=extra["do_sample"],
            )
            torch.manual_seed(seed)
            wav = model.inference(text, lang, cond, speaker, **settings, **extra)["wav"]
            return codes[0].numpy(), pcm(wav)

        codes, wav = run_twice(whole)
        np.savez(out / f"whole_{name}.npz", codes=codes, pcm=wav)
        print(name, "codes", codes.tolist(), "samples", wav.shape[0], "peak", int(np.abs(wav).max()))

    for name, (case, seed, chunk) in STREAMS.items():
        text, lang, _ = CASES[case]

        def streamed(text=text, lang=lang, chunk=chunk, seed=seed):
            torch.manual_seed(seed)
            pieces = model.inference_stream(text, lang, cond, speaker, stream_chunk_size=chunk, **settings)
            return [pcm(p.numpy()) for p in pieces]

        pieces = run_twice(streamed)
        np.savez(out / f"stream_{name}.npz", **{f"piece{i}": p for i, p in enumerate(pieces)})
        print(name, "stream pieces", [p.shape[0] for p in pieces])

    digests = {
        f: hashlib.sha256((tiny / f).read_bytes()).hexdigest() for f in ("config.json", "model.pth", "vocab.json")
    }
    (out / "weights.json").write_text(json.dumps(digests, indent=1) + "\n")


if __name__ == "__main__":
    main(Path(sys.argv[1]), Path(sys.argv[2]))

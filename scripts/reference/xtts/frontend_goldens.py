"""Goldens of coqui-tts 0.28.0's sentence splitting and of speech through its text front end, on the tiny folder.

    python frontend_goldens.py TINY_DIR GOLDEN_DIR      (in the reference venv: setup.sh runs it)

Writes GOLDEN_DIR/split.json: for each text of ``SPLITS``, the pieces of the release's ``split_sentence``
with its language's ``char_limits`` (what ``Xtts.inference`` speaks with ``enable_text_splitting=True``); and
``frontend_*.npz``: ``Xtts.inference`` (16-bit PCM) of the ``SPEECH`` texts (a price, Chinese, Japanese, a text
split in two), and ``Xtts.inference_stream``'s pieces of the split text. Every call runs twice and must give
the same bytes both times (``run_reference.run_twice``); the weights must be those of ``weights.json``
(run_reference.py writes it; checked here by sha256).
"""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).parent))
from run_reference import load_model, pcm, run_twice  # noqa: E402

LONG_EN = (
    "The quick brown fox jumps over the lazy dog. Mr. Smith paid $5.50 for it, didn't he? "
    + "Yes! " * 3
    + "This sentence goes on and on without a stop, with words and more words, "
    + "commas and clauses, " * 8
    + "until it is far longer than the limit. Then a short one. And another short sentence to end."
)
SPLITS = {  # name -> (text, the release's language code)
    "en_short": ("Hello there. How are you?", "en"),
    "en_long": (LONG_EN, "en"),
    "es_long": ("¿Dónde está la biblioteca? La Dra. García llegó el 1º de mayo. " * 5, "es"),
    "de_long": ("Es kostet 5,50€ am 3. Mai. Frau Dr. Müller hat 1.000 Bücher! Warum nicht? " * 4, "de"),
    "zh_long": ("这个东西价格是5.50元，打八折。我们有五十名士兵！你好吗？他在1999年出生。" * 3, "zh-cn"),
    "ja_long": ("今日はいい天気ですね。明日は雨が降るでしょう！本当ですか？" * 3, "ja"),
}
# name -> (text, language, enable_text_splitting); all greedy (do_sample=False), at the checkpoint's settings
SPEECH = {
    "price_en": ("It costs $5.50, 20% off.", "en", False),
    "zh": ("你好，价格是5元。", "zh-cn", False),
    "ja": ("今日はいい天気ですね。", "ja", False),
    "split_ja": ("今日は。" * 9 + "明日は雨が降るでしょう。" * 4, "ja", True),
}
STREAM = ("split_ja", 3, 0)  # inference_stream of this SPEECH text: stream_chunk_size, seed


def main(tiny: Path, out: Path) -> None:
    from TTS.tts.layers.xtts.tokenizer import split_sentence

    from omnistage.models.xtts.tiny import reference_clip

    pinned = json.loads((out / "weights.json").read_text())
    for name, digest in pinned.items():
        assert hashlib.sha256((tiny / name).read_bytes()).hexdigest() == digest, f"{name} is not the pinned build"
    model = load_model(tiny)
    config = model.config
    limits = model.tokenizer.char_limits
    split = {}
    for name, (text, lang) in SPLITS.items():
        code = lang.split("-")[0]
        split[name] = {"text": text, "language": lang, "pieces": split_sentence(text, code, limits[code])}
    (out / "split.json").write_text(json.dumps(split, indent=1, ensure_ascii=False) + "\n")

    audio = torch.from_numpy(reference_clip()).reshape(1, -1).clip(-1, 1)
    speaker = model.get_speaker_embedding(audio, 22050)
    cond = model.get_gpt_cond_latents(audio, 22050, length=config.gpt_cond_len, chunk_length=config.gpt_cond_chunk_len)
    settings = {k: config[k] for k in ("temperature", "length_penalty", "repetition_penalty", "top_k", "top_p")}
    for name, (text, lang, splitting) in SPEECH.items():

        def whole(text=text, lang=lang, splitting=splitting):
            torch.manual_seed(0)
            got = model.inference(
                text, lang, cond, speaker, **settings, do_sample=False, enable_text_splitting=splitting
            )
            return [pcm(got["wav"])]

        (wav,) = run_twice(whole)
        np.savez(out / f"frontend_{name}.npz", pcm=wav)
        print(name, "samples", wav.shape[0], "peak", int(np.abs(wav).max()))

    name, chunk, seed = STREAM
    text, lang, _ = SPEECH[name]

    def streamed():
        torch.manual_seed(seed)
        pieces = model.inference_stream(
            text, lang, cond, speaker, stream_chunk_size=chunk, enable_text_splitting=True, **settings
        )
        return [pcm(p.numpy()) for p in pieces]

    pieces = run_twice(streamed)
    np.savez(out / f"frontend_stream_{name}.npz", **{f"piece{i}": p for i, p in enumerate(pieces)})
    print(name, "stream pieces", [p.shape[0] for p in pieces])


if __name__ == "__main__":
    main(Path(sys.argv[1]), Path(sys.argv[2]))

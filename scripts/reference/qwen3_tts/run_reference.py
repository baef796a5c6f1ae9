"""Goldens for omnistage's qwen3_tts tests: qwen-tts 0.1.1 run greedy on the tiny checkpoints, one case per
generation mode (run in the reference venv that ``setup.sh`` builds).

    HF_HUB_OFFLINE=1 /work/refvenv/qwen3_tts/bin/python run_reference.py TINY_DIR GOLDEN_DIR

Writes GOLDEN_DIR/cases.json (each case: checkpoint kind, the package call and its arguments),
GOLDEN_DIR/<case>.npz (codes [frames, groups] int64, wav float32, sr, the text ids the model saw),
GOLDEN_DIR/ref_clip.npz (the reference clip of the cloning cases) + clone_prompt.npz (its codes and
x-vector), and copies the tiny checkpoints the reference loaded to GOLDEN_DIR/../tiny/ (why: make_tiny.py).
Every case runs twice and must be bit-identical (the package is deterministic on the CPU).
"""

import json
import os
import shutil
import sys

os.environ.setdefault("HF_HUB_OFFLINE", "1")
import numpy as np
import torch
from qwen_tts import Qwen3TTSModel

GREEDY = dict(do_sample=False, subtalker_dosample=False, repetition_penalty=1.0, max_new_tokens=12)
REF_TEXT = "This is a test."

CASES = [  # (name, kind, method, arguments)
    (
        "cv_vivian",
        "custom_voice",
        "generate_custom_voice",
        dict(text="Hello world.", speaker="Vivian", language="English"),
    ),
    (
        "cv_ryan_instruct",
        "custom_voice",
        "generate_custom_voice",
        dict(text="Hello world.", speaker="Ryan", language="English", instruct="Speak slowly."),
    ),
    (
        "cv_dylan_dialect",
        "custom_voice",
        "generate_custom_voice",
        dict(text="你好，世界。", speaker="Dylan", language="Auto"),
    ),
    (
        "cv_vivian_streamtext",
        "custom_voice",
        "generate_custom_voice",
        dict(
            text="The quick brown fox jumps over the lazy dog.",
            speaker="vivian",
            language="English",
            non_streaming_mode=False,
        ),
    ),
    (
        "vd_design",
        "voice_design",
        "generate_voice_design",
        dict(text="Hello world.", instruct="A calm, deep male voice.", language="English"),
    ),
    ("vc_icl", "base", "generate_voice_clone", dict(text="Hello world.", language="English", ref_text=REF_TEXT)),
    ("vc_xvec", "base", "generate_voice_clone", dict(text="Hello world.", language="English", x_vector_only_mode=True)),
    (
        "cv06_vivian",
        "custom_voice_0b6",
        "generate_custom_voice",
        dict(text="Hello world.", speaker="Vivian", language="English"),
    ),
]


def main(tiny, out):
    os.makedirs(out, exist_ok=True)
    torch.set_num_threads(1)
    rng = np.random.default_rng(1234)
    ref = (0.3 * rng.standard_normal(24000)).clip(-1, 1).astype(np.float32)  # 1 s at 24 kHz
    np.savez_compressed(os.path.join(out, "ref_clip.npz"), wav=ref, sr=24000)
    models = {}
    listing = []
    for name, kind, method, args in CASES:
        if kind not in models:
            m = Qwen3TTSModel.from_pretrained(
                os.path.join(tiny, kind), dtype=torch.float32, attn_implementation="eager", device_map="cpu"
            )
            seen = {}
            generate = m.model.generate

            def recording(*a, _generate=generate, _seen=seen, **k):  # the talker's codes and text ids
                codes, hidden = _generate(*a, **k)
                _seen["codes"] = codes[0].cpu().numpy()
                _seen["input_ids"] = k["input_ids"][0].cpu().numpy()
                return codes, hidden

            m.model.generate = recording
            models[kind] = (m, seen)
        m, seen = models[kind]
        call = dict(args, **({"ref_audio": (ref, 24000)} if kind == "base" else {}))
        runs = []
        for _ in range(2):
            wavs, sr = getattr(m, method)(**call, **GREEDY)
            runs.append((seen["codes"].copy(), np.asarray(wavs[0], dtype=np.float32), int(sr)))
        (codes, wav, sr), (codes2, wav2, _) = runs
        assert np.array_equal(codes, codes2) and np.array_equal(wav, wav2), f"{name}: not deterministic"
        np.savez_compressed(os.path.join(out, f"{name}.npz"), codes=codes, wav=wav, sr=sr, input_ids=seen["input_ids"])
        listing.append({"name": name, "kind": kind, "method": method, "args": args, "generate": GREEDY})
        print(name, codes.shape, wav.shape, float(np.abs(wav).max()), flush=True)
    m, _ = models["base"]
    item = m.create_voice_clone_prompt(ref_audio=(ref, 24000), ref_text=REF_TEXT)[0]
    np.savez_compressed(
        os.path.join(out, "clone_prompt.npz"),
        ref_code=item.ref_code.cpu().numpy(),
        spk_embedding=item.ref_spk_embedding.float().cpu().numpy(),
    )
    with open(os.path.join(out, "cases.json"), "w") as f:
        json.dump({"qwen_tts": "0.1.1", "torch": torch.__version__, "cases": listing}, f, indent=1, ensure_ascii=False)
    dest = os.path.join(os.path.dirname(os.path.abspath(out)), "tiny")
    shutil.rmtree(dest, ignore_errors=True)
    shutil.copytree(tiny, dest)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])

"""Run NVIDIA PersonaPlex's persona conditioning (its fork of the authors' ``moshi``, 0.1.0) on the tiny checkpoint
and write the voice preset and the golden the persona tests compare with.

    python run_persona.py TINY_DIR GOLDEN_DIR    (in the venv built by setup_personaplex.sh)

What PersonaPlex's ``moshi.offline`` / ``moshi.server`` do before a conversation (``LMGen.step_system_prompts``):
the voice prompt (a preset's stored temporal-input embeddings replayed, then its token cache restored), 0.5 s of
silence frames, the text prompt (``<system> ... <system>`` tokenized with the text stream's SentencePiece, one
token per step) and 0.5 s of silence again; every prompt step forces the text and the model's audio codes and
feeds a fixed "sine" frame as the user's codes, and what the model draws meanwhile is discarded. Then the user's
frames are stepped with ``LMGen.step`` (greedy).

The preset: PersonaPlex's voices ship as ``.pt`` files (``embeddings`` [N, 1, 1, dim] and ``cache``) written by
``LMGen`` with ``save_voice_prompt_embeddings``. Here one is written the same way, from fixed random voice codes
(the tiny Mimi has no voice to encode; a preset stores what the encoder gave), into TINY_DIR/voices/tiny.pt.

The silence and sine codes are PersonaPlex's constants for the real Mimi (card 2048); the tiny Mimi's card is 64,
so the tiny config.json names in-range ones (``persona_silence_codes``, ``persona_sine_codes``) and they are set
here in PersonaPlex's module. The tiny checkpoint keeps the attention projections split per step (moshi 0.2.13's
layout); PersonaPlex's ``LMModel`` takes them fused, so they are concatenated back here.

The user's frames are the codes of ``golden/a.npz`` (moshi 0.2.13's Mimi on signal "a": Mimi is not what
PersonaPlex changes). GOLDEN_DIR/persona.npz holds ``user_codes`` [T, 8], ``text_prompt_tokens`` and ``tokens``
[T, 9] (text + 8 codes of each output frame); GOLDEN_DIR/persona.json the prompt and the inputs' hashes. The run
is done twice and must agree.
"""

from __future__ import annotations

import hashlib
import json
import re
import sys
from pathlib import Path

import numpy as np
import sentencepiece
import torch
from moshi.models import lm as pp_lm
from moshi.models.lm import LMGen, LMModel
from moshi.offline import wrap_with_system_tags
from safetensors.torch import load_file

INSTRUCTIONS = "You are a teacher."
VOICE_FRAMES = 5  # the preset's voice prompt, in 80 ms frames
VOICE_SEED = 7


def load_lm(folder: Path, config: dict) -> LMModel:
    kwargs = {k: v for k, v in config.items() if not k.endswith("_name") and k != "model_type"}
    kwargs = {k: v for k, v in kwargs.items() if not k.startswith("persona_")}
    lm = LMModel(device="cpu", dtype=torch.float32, **kwargs)
    state = load_file(folder / config["moshi_name"])
    fused: dict[str, list] = {}
    for key in sorted(state):
        m = re.match(r"(.*self_attn\.)(in|out)_projs\.(\d+)\.weight$", key)
        if m:
            name = m.group(1) + ("in_proj_weight" if m.group(2) == "in" else "out_proj.weight")
            fused.setdefault(name, []).append((int(m.group(3)), state[key]))
    merged = {k: v for k, v in state.items() if "_projs." not in k}
    merged.update({k: torch.cat([t for _, t in sorted(parts, key=lambda p: p[0])]) for k, parts in fused.items()})
    lm.load_state_dict(merged, strict=True)
    return lm.eval()


class FixedCodes(torch.nn.Module):
    """Stands in for Mimi's encoder when the preset is made: each 1920-sample frame -> the next fixed codes."""

    def __init__(self, codes: torch.Tensor):
        super().__init__()
        self.anchor = torch.nn.Parameter(torch.zeros(1))  # encode_from_sphn reads the device off a parameter
        self.codes, self.at = codes, 0

    def encode(self, x: torch.Tensor) -> torch.Tensor:
        out = self.codes[:, :, self.at : self.at + x.shape[0]].permute(2, 0, 1)
        self.at += x.shape[0]
        return out.reshape(x.shape[0], -1, 1)


def lm_gen(lm: LMModel, **kw) -> LMGen:
    return LMGen(
        lm,
        device="cpu",
        use_sampling=False,
        temp=0.0,
        temp_text=0.0,
        audio_silence_frame_cnt=6,
        sample_rate=24000,
        frame_rate=12.5,
        **kw,
    )


def make_preset(lm: LMModel, card: int, path: Path) -> None:
    gen = torch.Generator().manual_seed(VOICE_SEED)
    codes = torch.randint(0, card, (1, 8, VOICE_FRAMES), generator=gen)
    g = lm_gen(lm, save_voice_prompt_embeddings=True)
    g.voice_prompt = str(path.with_suffix(".wav"))  # the preset is saved beside it, as <stem>.pt
    g.voice_prompt_audio = np.zeros((1, VOICE_FRAMES * 1920), np.float32)
    with g.streaming(1):
        g._step_voice_prompt(FixedCodes(codes))


@torch.no_grad()
def converse(lm: LMModel, user_codes: np.ndarray, preset: Path, prompt: list[int]) -> np.ndarray:
    g = lm_gen(lm)
    out = []
    with g.streaming(1):
        g.load_voice_prompt_embeddings(str(preset))
        g.text_prompt_tokens = prompt
        g.step_system_prompts(None)  # a preset needs no Mimi
        for codes in user_codes:
            tokens = g.step(torch.from_numpy(codes).view(1, 8, 1))
            if tokens is not None:
                out.append(tokens[0, :, 0].numpy())
    return np.stack(out).astype(np.int64)


def main(tiny: str, golden: str) -> None:
    torch.manual_seed(0)
    torch.set_num_threads(1)
    folder, out = Path(tiny), Path(golden)
    config = json.loads((folder / "config.json").read_text())
    pp_lm.SILENCE_TOKENS = np.array(config["persona_silence_codes"], dtype=np.int64)
    pp_lm.SINE_TOKENS = np.array(config["persona_sine_codes"], dtype=np.int64)
    lm = load_lm(folder, config)
    preset = folder / "voices" / "tiny.pt"
    preset.parent.mkdir(exist_ok=True)
    make_preset(lm, config["card"], preset)
    tokenizer = sentencepiece.SentencePieceProcessor(model_file=str(folder / config["tokenizer_name"]))
    prompt = tokenizer.encode(wrap_with_system_tags(INSTRUCTIONS))
    user_codes = np.load(out / "a.npz")["user_codes"]
    tokens = converse(lm, user_codes, preset, prompt)
    again = converse(lm, user_codes, preset, prompt)
    assert (tokens == again).all(), "the reference is not deterministic"
    np.savez_compressed(
        out / "persona.npz",
        user_codes=user_codes,
        text_prompt_tokens=np.array(prompt, np.int64),
        tokens=tokens,
    )
    meta = {
        "instructions": INSTRUCTIONS,
        "voice": "tiny",
        "model_sha256": hashlib.sha256((folder / config["moshi_name"]).read_bytes()).hexdigest(),
        "voice_sha256": hashlib.sha256(preset.read_bytes()).hexdigest(),
    }
    (out / "persona.json").write_text(json.dumps(meta, indent=1) + "\n")
    print("persona text", tokens[:, 0].tolist())
    print("persona codes[0]", tokens[:, 1].tolist())


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])

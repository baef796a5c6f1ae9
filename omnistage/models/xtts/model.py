"""XTTS v2 at inference, for omnistage's step-batched AR engine and the decoder stage.

- ``conditioning``: a reference clip -> (the GPT's 32 conditioning latents, the decoder's speaker embedding),
  as the release's ``get_gpt_cond_latents`` / ``get_speaker_embedding`` compute them.
- ``prefill`` / ``step``: the GPT over per-request KV caches (``stages/ar/kv.py``), one padded batch per call.
  The prompt is [conditioning latents, [START] text [STOP], start-audio]; each call yields every row's next
  audio code and the latent that produced it (the final-normed hidden state), which is what the decoder
  reads: the release's ``inference_stream`` takes the same per-step latents, and its ``inference`` recomputes
  them in one forward over the finished codes (equal up to float rounding).
- Sampling as transformers' ``generate`` under the release's settings: the repetition penalty over every id
  of the sequence (the prompt's placeholder ids included), then temperature, top-k, top-p (``draw``).
- ``decode``: latents [T, d] + speaker embedding -> 24 kHz audio.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from omnistage.models.shared.higgs_tokenizer.encoder import resample
from omnistage.models.xtts.conditioning import COND_RATE, ClipConditioner
from omnistage.models.xtts.config import XttsArgs, XttsParams, read_args
from omnistage.models.xtts.hifigan import HifiganGenerator, vocoder_input
from omnistage.models.xtts.net import XttsNet, load_state
from omnistage.models.xtts.speaker import SPEAKER_RATE
from omnistage.models.xtts.text import token_ids
from omnistage.stages.ar.kv import RequestKV, StepCache
from omnistage.stages.ar.sampling import draw

PROMPT_FILL_ID = 1  # the placeholder id the release's generate() sees at every prompt position


@dataclass(eq=False)
class XttsRow:
    """One request's GPT state."""

    params: XttsParams
    generator: torch.Generator | None
    kv: RequestKV
    seen: set[int] = field(default_factory=set)  # ids the repetition penalty applies to
    codes: int = 0  # audio codes fed back so far (the next one's position)
    emitted: int = 0  # codes drawn so far
    last_code: int = -1  # the last code drawn (the next step's input)


class XttsModel:
    def __init__(self, folder: str | Path, device: str = "cpu", dtype: torch.dtype = torch.float32):
        from tokenizers import Tokenizer

        folder = Path(folder)
        self.args: XttsArgs = read_args(folder)
        self.tokenizer = Tokenizer.from_file(str(folder / "vocab.json"))
        text_tokens = max(self.tokenizer.get_vocab().values()) + 1
        self.start_text = self.tokenizer.token_to_id("[START]")
        self.stop_text = self.tokenizer.token_to_id("[STOP]")
        net = XttsNet(self.args, text_tokens)
        load_state(str(folder / "model.pth"), net)
        net.hifigan_decoder.waveform_decoder.fold_weight_norm()
        self.net = net.to(device=device, dtype=dtype).eval()
        self.gpt = self.net.gpt
        self.device, self.dtype = device, dtype
        self.conditioner = ClipConditioner(self.gpt, self.net.mel_stats)

    # ------------------------------------------------------------------ conditioning

    @torch.inference_mode()
    def conditioning(self, samples: np.ndarray, rate: int) -> tuple[torch.Tensor, torch.Tensor]:
        """A mono clip -> (GPT conditioning latents [32, d], speaker embedding [512, 1]); the clip is read at
        22.05 kHz (up to ``max_ref_len`` seconds) and clipped to [-1, 1], as the release loads it."""
        audio = torch.as_tensor(np.asarray(samples, dtype=np.float32)).reshape(1, -1)
        if rate != COND_RATE:
            audio = resample(audio, rate, COND_RATE)
        audio = audio.clamp(-1, 1)[:, : int(COND_RATE * self.args.max_ref_len)].to(self.device, self.dtype)
        if self.args.sound_norm_refs:
            audio = audio / audio.abs().max() * 0.75
        speaker = self.net.hifigan_decoder.speaker_encoder(resample(audio, COND_RATE, SPEAKER_RATE))
        latents = self.conditioner(audio, self.args.gpt_cond_len, self.args.gpt_cond_chunk_len)
        return latents[0], speaker[0]

    def text_ids(self, text: str, language: str) -> list[int]:
        return token_ids(self.tokenizer, text, language)

    # ------------------------------------------------------------------ GPT

    def new_row(self, params: XttsParams, generator: torch.Generator | None) -> XttsRow:
        return XttsRow(params, generator, RequestKV(self.args.layers), {PROMPT_FILL_ID, self.args.start_audio_token})

    def _forward(self, rows: list[XttsRow], embeds: list[torch.Tensor]) -> list[tuple[int, torch.Tensor]]:
        """One GPT forward (row i continues its cache with ``embeds[i]`` [T_i, d]); each row's next code and
        the latent [d] that produced it."""
        lengths = [e.shape[0] for e in embeds]
        cache = StepCache([r.kv for r in rows], lengths)
        x = torch.zeros(len(rows), cache.new_tokens, self.args.dim, device=self.device, dtype=self.dtype)
        for i, e in enumerate(embeds):
            x[i, : e.shape[0]] = e
        t = torch.arange(cache.new_tokens, device=self.device)
        out = self.gpt.gpt(
            inputs_embeds=x,
            position_ids=torch.stack([s + t for s in cache.starts]),
            attention_mask=cache.mask(self.device),
            past_key_values=cache,
            use_cache=True,
        )
        cache.commit()
        last = out.last_hidden_state[torch.arange(len(rows)), torch.tensor(lengths) - 1]
        latents = self.gpt.final_norm(last)
        logits = self.gpt.mel_head(latents).float()
        return [(self._choose(r, logits[i]), latents[i]) for i, r in enumerate(rows)]

    def _choose(self, row: XttsRow, logits: torch.Tensor) -> int:
        seen = torch.tensor(sorted(row.seen), device=logits.device)
        score = logits[seen]
        penalty = row.params.repetition_penalty
        logits = logits.scatter(0, seen, torch.where(score < 0, score * penalty, score / penalty))
        s = row.params.sampling
        code = draw(logits, s.temperature, s.top_k, s.top_p, row.generator)
        row.seen.add(code)
        row.last_code, row.emitted = code, row.emitted + 1
        return code

    def _code_embedding(self, codes: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        return self.gpt.mel_embedding(codes) + self.gpt.mel_pos_embedding.emb(positions)

    @torch.inference_mode()
    def prefill(self, rows: list[XttsRow], prompts: list[tuple[torch.Tensor, list[int]]]):
        """``prompts[i]``: (conditioning latents [32, d], text ids) of row i."""
        embeds = []
        for cond, ids in prompts:
            text = torch.tensor([self.start_text, *ids, self.stop_text], device=self.device)
            text_emb = self.gpt.text_embedding(text) + self.gpt.text_pos_embedding.emb(
                torch.arange(len(text), device=self.device)
            )
            start = torch.tensor([self.args.start_audio_token], device=self.device)
            audio = self._code_embedding(start, torch.zeros(1, dtype=torch.long, device=self.device))
            embeds.append(torch.cat([cond.to(self.device, self.dtype), text_emb, audio]))
        return self._forward(rows, embeds)

    @torch.inference_mode()
    def step(self, rows: list[XttsRow]):
        """Feed each row its last code; each row's next (code, latent)."""
        embeds = []
        for r in rows:
            r.codes += 1
            pos = torch.tensor([r.codes], device=self.device)
            embeds.append(self._code_embedding(torch.tensor([r.last_code], device=self.device), pos))
        return self._forward(rows, embeds)

    # ------------------------------------------------------------------ decoder

    def decode(self, latents: torch.Tensor, speaker: torch.Tensor, speed: float = 1.0) -> torch.Tensor:
        return decode(self.net.hifigan_decoder.waveform_decoder, latents, speaker, speed)


@torch.inference_mode()
def decode(vocoder: torch.nn.Module, latents: torch.Tensor, speaker: torch.Tensor, speed: float = 1.0) -> torch.Tensor:
    """Latents [T, d] + speaker embedding [512, 1] -> float32 audio [samples] at 24 kHz; ``speed`` stretches the
    latents as the release's ``length_scale`` does."""
    p = next(vocoder.parameters())
    x = latents.to(p.device, p.dtype)[None]
    if speed != 1.0:
        scale = 1.0 / max(speed, 0.05)
        x = F.interpolate(x.transpose(1, 2), scale_factor=scale, mode="linear").transpose(1, 2)
    return vocoder(vocoder_input(x), speaker.to(p.device, p.dtype)[None]).reshape(-1).float()


def load_vocoder(folder: str | Path, device: str = "cpu", dtype: torch.dtype = torch.float32) -> torch.nn.Module:
    """The checkpoint's HiFi-GAN generator alone (the decoder stage needs nothing else of ``model.pth``)."""
    args = read_args(Path(folder))
    vocoder = HifiganGenerator(args.dim, args.d_vector_dim)
    prefix = "hifigan_decoder.waveform_decoder."
    state = torch.load(Path(folder) / "model.pth", map_location="cpu", weights_only=True)["model"]
    state = {
        k.removeprefix("xtts.")[len(prefix) :]: v
        for k, v in state.items()
        if k.removeprefix("xtts.").startswith(prefix)
    }
    vocoder.load_state_dict(state, strict=True)
    vocoder.fold_weight_norm()
    return vocoder.to(device=device, dtype=dtype).eval()

"""The talker's arithmetic as transformers' ``Qwen2_5OmniForConditionalGeneration.generate`` does it (read there:
``generate`` from "2. Generate speech tokens", and the talker's ``forward``), over transformers' own
``Qwen2_5OmniTalkerForConditionalGeneration``:

- **prefill input** (before ``thinker_to_talker_proj``): for each prompt token the thinker's last-layer hidden
  state plus its input embedding (zero at media positions), then the speaker's text bos embedding, then the
  first reply token (hidden state + embedding); ``codec_pad`` and ``codec_bos`` embeddings added to the last
  two rows. Positions: the talker's ``get_rope_index`` over prompt ids + bos + first reply token and the media
  grids (``use_audio_in_video`` included), as transformers passes them.
- **each step**: the previous code's codec embedding plus the next *trailing* row — the hidden state + embedding
  of reply tokens 2..n-1, then the thinker's ``tts_text_end`` embedding, then ``tts_text_pad`` for ever (the engine
  hands each step its item as the thinker's rows arrive: ``talker_engine.py``).
- **sampling**: transformers' logits processors in order — repetition penalty over the talker's whole input
  ids (``codec_mask`` × prompt, ``codec_pad``, ``codec_bos``, then the codes drawn), ``codec_bos`` suppressed —
  then greedy or temperature / top-k / top-p; ``codec_pad`` or ``codec_end`` ends the speech.

Several requests run as one batch per step (``stages.ar.kv.StepCache``); each row computes what it would alone.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from omnistage.models.qwen2_5_omni.checkpoint import load_config, load_talker, load_thinker_embedding
from omnistage.models.qwen2_5_omni.config import TALKER_EOS
from omnistage.models.shared.step_forward import forward_rows, rope_delta_positions
from omnistage.stages.ar.kv import RequestKV
from omnistage.stages.ar.sampling import draw


@dataclass
class Qwen25TalkerRow:
    """One request's state in the talker (touched only by the step thread while a step runs)."""

    kv: RequestKV
    sampling: Any  # shared.omni.sampling.Sampling (temperature, top_k, top_p, repetition_penalty, generator)
    rope_delta: int = 0
    code: int | None = None  # the code drawn last (the next step's input)
    history: list[int] = field(default_factory=list)  # the talker's input ids so far (repetition penalty)
    step: int = 0  # steps taken: which trailing item the next one reads


class TalkerModel:
    def __init__(self, folder: str | Path, device: str = "cpu", dtype: torch.dtype = torch.float32):
        self.config = config = load_config(folder)
        self.device, self.dtype = device, dtype
        self.talker = load_talker(folder, config, dtype, device)
        self.embed = load_thinker_embedding(folder, dtype, device)
        tc = config.talker_config
        self.num_layers = tc.num_hidden_layers
        self.codec_bos, self.codec_pad, self.codec_mask = (
            tc.tts_codec_start_token_id,
            tc.tts_codec_pad_token_id,
            tc.tts_codec_mask_token_id,
        )
        self.eos = set(TALKER_EOS)
        th = config.thinker_config
        self.media_ids = torch.tensor(sorted({th.audio_token_index, th.image_token_index, th.video_token_index}))
        with torch.no_grad():
            self.text_eos = self.embed(torch.tensor([tc.tts_text_end_token_id], device=device))
            self.text_pad = self.embed(torch.tensor([tc.tts_text_pad_token_id], device=device))
            self.codec = self.talker.get_input_embeddings()

    @torch.no_grad()
    def prefill_input(
        self, prompt_ids: list[int], first: int, hidden: list[torch.Tensor], bos_token: int, media: dict | None
    ) -> tuple[torch.Tensor, torch.Tensor, int]:
        """(embeds [L+2, H] before the projection, positions [3, L+2], rope delta). ``hidden``: the thinker's hidden
        states ([D] rows) of ``prompt_ids + [first]`` (the first reply token)."""
        n_prompt = len(prompt_ids)
        hidden = torch.stack(hidden).to(self.device, self.dtype)
        ids = torch.tensor(prompt_ids + [first], device=self.device)
        embeds = self.embed(ids)
        embeds[:n_prompt][torch.isin(ids[:n_prompt], self.media_ids.to(self.device))] = 0  # generate() zeroes them
        rows = hidden + embeds  # [L + 1, H]
        bos = self.embed(torch.tensor([bos_token], device=self.device))
        prefill = torch.cat([rows[:n_prompt], bos, rows[n_prompt:]], dim=0)
        prefill[-1] += self.codec(torch.tensor(self.codec_bos, device=self.device))
        prefill[-2] += self.codec(torch.tensor(self.codec_pad, device=self.device))
        text_ids = torch.tensor([prompt_ids + [bos_token, first]], device=self.device)
        media = media or {}
        positions, delta = self.talker.get_rope_index(
            text_ids,
            _on(media.get("image_grid_thw"), self.device),
            _on(media.get("video_grid_thw"), self.device),
            torch.ones_like(text_ids),
            bool(media.get("use_audio_in_video")),
            _on(media.get("audio_feature_lengths"), self.device),
            _on(media.get("video_second_per_grid"), self.device),
        )
        return prefill, positions[:, 0], int(delta.reshape(-1)[0])

    def _text(self, item: Any) -> torch.Tensor:
        """A step's trailing row [H]: a reply token's hidden state + embedding, or ``tts_text_end`` / ``_pad``."""
        if item == "end":
            return self.text_eos[0]
        if item == "pad":
            return self.text_pad[0]
        hidden, token = item
        return hidden.to(self.device, self.dtype) + self.embed(torch.tensor(token, device=self.device))

    def _forward(
        self, rows: list[Qwen25TalkerRow], embeds: torch.Tensor, positions: torch.Tensor | None = None
    ) -> torch.Tensor:
        """One talker forward of ``embeds`` [B, T, H] (row i continues its own cache; ``positions`` [3, B, T] when
        given, else each row's next positions); the codec logits of the last position [B, V] (float32)."""
        at = rope_delta_positions([r.rope_delta for r in rows], positions)
        embeds = self.talker.thinker_to_talker_proj(embeds)
        hidden = forward_rows(self.talker.model, [r.kv for r in rows], embeds, positions=at)
        return self.talker.codec_head(hidden[:, -1]).float()

    def _sample(self, rows: list[Qwen25TalkerRow], logits: torch.Tensor) -> list[int]:
        codes = []
        for i, row in enumerate(rows):
            code = sample(logits[i], row.sampling, row.history, self.codec_bos)
            row.history.append(code)
            row.code = code
            codes.append(code)
        return codes

    @torch.no_grad()
    def prefill(self, row: Qwen25TalkerRow, embeds: torch.Tensor, positions: torch.Tensor, rope_delta: int) -> int:
        """One request's prefill; returns its first code."""
        row.rope_delta = rope_delta
        row.history = [self.codec_mask] * (embeds.shape[0] - 2) + [self.codec_pad, self.codec_bos]
        return self._sample([row], self._forward([row], embeds.unsqueeze(0), positions.unsqueeze(1)))[0]

    @torch.no_grad()
    def step(self, rows: list[Qwen25TalkerRow], items: list[Any]) -> list[int]:
        """Every row's next code: its last code's embedding plus its trailing row (``_text`` of its item)."""
        codes = torch.tensor([r.code for r in rows], device=self.device)
        text = torch.stack([self._text(item) for item in items])
        for r in rows:
            r.step += 1
        return self._sample(rows, self._forward(rows, (self.codec(codes) + text).unsqueeze(1)))


def _on(value, device: str) -> torch.Tensor | None:
    return None if value is None else torch.as_tensor(value).to(device)


def sample(logits: torch.Tensor, s: Any, history: list[int], suppressed: int) -> int:
    """One code from float32 ``logits`` [V] in transformers' processor order (repetition penalty, suppressed
    token, then temperature / top-k / top-p)."""
    scores = logits.clone()
    if history and s.repetition_penalty != 1.0:
        idx = torch.tensor(sorted(set(history)), device=scores.device)
        seen = scores[idx]
        scores[idx] = torch.where(seen < 0, seen * s.repetition_penalty, seen / s.repetition_penalty)
    scores[suppressed] = float("-inf")
    return draw(scores, s.temperature, s.top_k, s.top_p, s.generator)

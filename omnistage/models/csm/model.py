"""CSM's arithmetic, step by step, as transformers' ``CsmForConditionalGeneration.generate`` does it
(read there: ``generation_csm.py`` ``_sample`` and ``modeling_csm.py``
``_merge_input_ids_with_input_values``), over the transformers modules:

- **prompt**: ``CsmProcessor.apply_chat_template`` of the turns (``[speaker]text``; each earlier turn's
  audio follows it as Mimi frames + ``<|audio_eos|>``); text positions are ``embed_text_tokens``, audio
  positions the sum of the frame's codebook embeddings (``backbone_model.embed_tokens``) of the clip's
  Mimi codes, ``<|audio_eos|>`` the embedding of an all-``codebook_eos`` frame.
- **each frame**: the backbone samples codebook 0 from its last (normed) hidden state; the depth decoder
  (its own small transformer, started from that hidden state and code 0) samples codebooks 1..K-1; the
  next backbone input is the frame's summed codebook embeddings. A frame whose codebooks 0..K-2 are all
  ``codebook_eos`` ends the speech (it is not audio: transformers cuts it before decoding).

Batching: the backbone runs all requests' rows as one right-padded batch (``stages.ar.kv``); the depth
decoder needs no padding (every row is at the same codebook), so it is one plain batch per codebook.
Sampling is per row with the request's own generator, in transformers' order (code 0, then codes 1..K-1).
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import pairwise
from pathlib import Path
from typing import Any

import numpy as np
import torch
from transformers import DynamicCache

from omnistage.errors import InvalidRequestError
from omnistage.models.shared.step_forward import forward_rows
from omnistage.stages.ar.kv import RequestKV
from omnistage.stages.ar.params import TokenSampling
from omnistage.stages.ar.sampling import draw


@dataclass
class Turn:
    speaker: str
    text: str
    audio: np.ndarray | None = None  # mono float32 at the codec's rate


@dataclass
class CsmRow:
    """One request's state (touched only by the step thread while a step runs)."""

    kv: RequestKV
    backbone: TokenSampling
    depth: TokenSampling
    generator: torch.Generator | None
    code0: int | None = None  # codebook 0 of the frame the next step completes
    hidden: torch.Tensor | None = None  # the backbone's last normed hidden state [H]


class CsmModel:
    def __init__(self, folder: str | Path, device: str = "cpu", dtype: torch.dtype = torch.float32):
        from transformers import AutoProcessor, CsmForConditionalGeneration

        # sdpa: the engine passes boolean 4-D masks (padded batches of per-request caches)
        self.model = CsmForConditionalGeneration.from_pretrained(str(folder), dtype=dtype, attn_implementation="sdpa")
        self.model = self.model.to(device).eval()
        self.processor = AutoProcessor.from_pretrained(str(folder))
        self.device, self.dtype = device, dtype
        cfg = self.model.config
        self.num_codebooks = cfg.num_codebooks
        self.eos = cfg.codebook_eos_token_id
        self.num_layers = cfg.num_hidden_layers
        self.max_positions = cfg.max_position_embeddings
        self.sample_rate = int(self.processor.feature_extractor.sampling_rate)

    # ------------------------------------------------------------------ prompt

    @torch.no_grad()
    def prompt_embeds(self, turns: list[Turn]) -> torch.Tensor:
        """The prompt as backbone inputs [L, H]."""
        conversation = [
            {
                "role": t.speaker,
                "content": [{"type": "text", "text": t.text}]
                + ([{"type": "audio", "path": t.audio}] if t.audio is not None else []),
            }
            for t in turns
        ]
        inputs = self.processor.apply_chat_template(conversation, tokenize=True, return_dict=True)
        ids = inputs["input_ids"][0].to(self.device)
        m, cfg = self.model, self.model.config
        embeds = m.embed_text_tokens(ids)
        audio_at = ids == cfg.audio_token_id
        if audio_at.any():
            values = inputs["input_values"][0].to(self.device, self.dtype)  # [1, samples of all clips]
            cuts = [0] + [int(c) for c in inputs["input_values_cutoffs"][0] if c >= 0]
            frames = [
                m.codec_model.encode(values[..., a:b].unsqueeze(0)).audio_codes[0].T  # [T, K]
                for a, b in pairwise(cuts)
            ]
            runs = _runs(audio_at)  # each clip's audio-token positions, in order
            if len(runs) != len(frames) or any(len(r) > f.shape[0] for r, f in zip(runs, frames)):
                raise ValueError("the processor's audio token count does not match the codec's frames")
            codes = torch.cat([f[: len(r)] for r, f in zip(runs, frames)])
            embeds[audio_at] = m.backbone_model.embed_tokens(codes.unsqueeze(0))[0]
        eos_at = ids == cfg.audio_eos_token_id
        if eos_at.any():
            eos_frame = torch.full((1, 1, self.num_codebooks), self.eos, dtype=torch.long, device=self.device)
            embeds[eos_at] = m.backbone_model.embed_tokens(eos_frame)[0, 0]
        return embeds

    # ------------------------------------------------------------------ steps

    def _backbone(self, rows: list[CsmRow], embeds: torch.Tensor) -> None:
        """One backbone forward of ``embeds`` [B, T, H] (row i continues its own cache), then each row's
        next codebook-0 code and last hidden state."""
        hidden = forward_rows(self.model.backbone_model, [r.kv for r in rows], embeds)[:, -1]
        logits = self.model.lm_head(hidden).float()
        for i, row in enumerate(rows):
            s = row.backbone
            row.code0 = draw(logits[i], s.temperature, s.top_k, s.top_p, row.generator)
            row.hidden = hidden[i]

    @torch.no_grad()
    def prefill(self, row: CsmRow, embeds: torch.Tensor) -> None:
        self._backbone([row], embeds.unsqueeze(0))

    @torch.no_grad()
    def frames(self, rows: list[CsmRow]) -> torch.Tensor:
        """The depth decoder over all rows: each row's pending frame [B, K] (codebook 0 first)."""
        decoder = self.model.depth_decoder
        code0 = torch.tensor([r.code0 for r in rows], device=self.device)
        ids = torch.stack([torch.zeros_like(code0), code0], dim=1)  # position 0 is the backbone's hidden state
        hidden = torch.stack([r.hidden for r in rows])
        cache = DynamicCache(config=decoder.config)
        codes = [code0]
        for g in range(1, self.num_codebooks):
            out = decoder(
                input_ids=ids,
                backbone_last_hidden_state=hidden if g == 1 else None,
                past_key_values=cache,
                use_cache=True,
                logits_to_keep=1,
            )
            logits = out.logits[:, -1].float()
            nxt = torch.tensor(
                [
                    draw(logits[i], r.depth.temperature, r.depth.top_k, r.depth.top_p, r.generator)
                    for i, r in enumerate(rows)
                ],
                device=self.device,
            )
            codes.append(nxt)
            ids = nxt.unsqueeze(1)
        return torch.stack(codes, dim=1)

    def is_end(self, frame: torch.Tensor) -> bool:
        """transformers' stop test: codebooks 0..K-2 all ``codebook_eos``."""
        return bool((frame[:-1] == self.eos).all())

    @torch.no_grad()
    def advance(self, rows: list[CsmRow], frames: torch.Tensor) -> None:
        """Feed each row's frame [B, K] to the backbone and sample the next codebook 0."""
        embeds = self.model.backbone_model.embed_tokens(frames.unsqueeze(1))  # [B, 1, H]
        self._backbone(rows, embeds)


def _runs(mask: torch.Tensor) -> list[list[int]]:
    """Maximal runs of consecutive True positions."""
    runs: list[list[int]] = []
    for i in mask.nonzero().flatten().tolist():
        if runs and runs[-1][-1] == i - 1:
            runs[-1].append(i)
        else:
            runs.append([i])
    return runs


def check_turn(speaker: Any, text: Any, where: str) -> None:
    if not isinstance(speaker, str) or not speaker.isdigit():
        raise InvalidRequestError(
            f"{where}speaker" if where else "voice",
            f"a CSM speaker is a non-negative integer id such as '0', got {speaker!r}",
        )
    if not isinstance(text, str) or not text.strip():
        raise InvalidRequestError(
            f"{where}text" if where else "prompt",
            "the text to speak is empty" if not where else "expected non-empty text",
        )

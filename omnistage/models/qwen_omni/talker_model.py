"""The talker's arithmetic, step by step, as transformers' ``Qwen3OmniMoeForConditionalGeneration.generate``
does it (read there: ``generate``, ``_get_talker_user_parts``, ``_get_talker_assistant_parts`` and the
talker's ``prepare_inputs_for_generation``), over the transformers modules:

- **prefill input**: the user turns of the thinker's prompt (``text_projection`` of the thinker's token
  embeddings; ``hidden_projection`` of its ``accept_hidden_layer`` hidden states at media positions), then
  the assistant head: ``<|im_start|>assistant\\n`` + 4 × ``tts_pad`` + ``tts_bos`` + the first reply token
  as text, added to the codec control codes ``nothink, think_bos, think_eos, speaker, codec_pad,
  codec_bos``. System turns and earlier assistant turns are not part of it.
- **each step**: the code predictor completes the last frame (codebooks 1..G-1 from the talker's last
  hidden state and codebook 0), the next talker input is the sum of the frame's G codec embeddings plus
  the text of the next reply token (``trailing`` text: reply tokens 2.., then ``tts_eos``, then
  ``tts_pad``), and the talker samples the next frame's codebook 0 (``codec_eos`` ends the speech).

Several requests run as one batch per step (``kv.StepCache``); each row computes what it would alone.
Sampling follows transformers' logits processing: repetition penalty over the request's codebook-0 codes,
the 1024 control codes suppressed (except ``codec_eos``), then greedy or temperature / top-k / top-p.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import torch
from transformers import DynamicCache

from omnistage.models.qwen_omni.checkpoint import load_config, load_talker, load_thinker_embedding
from omnistage.models.shared.omni.sampling import Sampling
from omnistage.models.shared.step_forward import forward_rows, last_real, rope_delta_positions
from omnistage.stages.ar.kv import RequestKV
from omnistage.stages.ar.sampling import draw

EOS_TEXT, PAD_TEXT = "eos", "pad"  # trailing text after the reply: tts_eos once, then tts_pad


@dataclass
class Qwen3TalkerRow:
    """One request's state in the talker (touched only by the step thread while a step runs)."""

    kv: RequestKV
    sampling: Sampling
    rope_delta: int = 0
    code0: int | None = None  # codebook 0 of the frame the next step completes
    hidden: torch.Tensor | None = None  # talker's last (normed) hidden state [H]
    history: list[int] = field(default_factory=list)  # sampled codebook-0 codes (repetition penalty)


class TalkerModel:
    def __init__(self, folder: str | Path, device: str = "cpu", dtype: torch.dtype = torch.float32):
        self.config = config = load_config(folder)
        self.device, self.dtype = device, dtype
        self.talker = load_talker(folder, config, dtype, device)
        self.thinker_embed = load_thinker_embedding(folder, dtype, device)
        tc = config.talker_config
        self.num_groups = tc.num_code_groups
        self.codec_eos = tc.codec_eos_token_id
        self.num_layers = tc.text_config.num_hidden_layers
        vocab = tc.text_config.vocab_size
        self.suppress = torch.zeros(vocab, dtype=torch.bool, device=device)
        self.suppress[vocab - 1024 :] = True  # control codes are never sampled, except the end of speech
        self.suppress[self.codec_eos] = False
        with torch.no_grad():
            bos, eos, pad = self.project_text(
                [config.tts_bos_token_id, config.tts_eos_token_id, config.tts_pad_token_id]
            )
        self.tts_bos, self.tts_eos, self.tts_pad = bos, eos, pad
        th = config.thinker_config
        self.media_id_set = {th.audio_token_id, th.image_token_id, th.video_token_id}
        self.media_ids = torch.tensor(sorted(self.media_id_set))

    # ------------------------------------------------------------------ inputs

    def project_text(self, ids: list[int]) -> torch.Tensor:
        """Thinker token ids -> talker inputs [n, H] (``text_projection`` of the thinker's embeddings)."""
        emb = self.thinker_embed(torch.tensor(ids, device=self.device)).unsqueeze(0)
        return self.talker.text_projection(emb)[0]

    def text_input(self, item: int | str) -> torch.Tensor:
        if item == EOS_TEXT:
            return self.tts_eos
        if item == PAD_TEXT:
            return self.tts_pad
        return self.project_text([int(item)])[0]

    def user_part(self, prompt_ids: list[int], media: dict | None) -> tuple[torch.Tensor, list[int]]:
        """The prompt's user-turn tokens (each token's role is the token after the last ``<|im_start|>``
        before it) as talker inputs, and their ids: ``text_projection`` of the thinker's token embeddings at
        text positions, ``hidden_projection`` of the thinker's hidden states (``media["hidden"]``, one row per
        media token of the prompt, in order) at media positions."""
        cfg = self.config
        ids = torch.tensor(prompt_ids)
        pos = torch.arange(len(prompt_ids))
        starts = torch.where(ids == cfg.im_start_token_id, pos, pos.new_full((), -1))
        previous = torch.cummax(starts, dim=0).values.clamp_min(0)
        roles = ids[(previous + 1).clamp_max(len(prompt_ids) - 1)]
        keep = (roles == cfg.user_token_id).nonzero().flatten()
        user_ids = ids[keep].tolist()
        if not user_ids:
            return torch.empty(0, self.tts_pad.shape[-1], dtype=self.dtype, device=self.device), []
        is_media = torch.isin(ids, self.media_ids)
        user_media = is_media[keep]
        out = torch.empty(len(user_ids), self.tts_pad.shape[-1], dtype=self.dtype, device=self.device)
        if user_media.any():
            if media is None:
                raise ValueError("the talker got a prompt with media placeholders but no thinker hidden states")
            rank = torch.cumsum(is_media.long(), 0) - 1  # a media position's row in media["hidden"]
            rows = media["hidden"].to(self.device, self.dtype)[rank[keep[user_media]]]
            out[user_media.to(self.device)] = self.talker.hidden_projection(rows)
        text = [t for t, m in zip(user_ids, user_media.tolist()) if not m]
        if text:
            out[~user_media.to(self.device)] = self.project_text(text)
        return out, user_ids

    @staticmethod
    def assistant_start(prompt_ids: list[int], im_start: int, assistant: int) -> int:
        for i in range(len(prompt_ids) - 2, -1, -1):
            if prompt_ids[i] == im_start and prompt_ids[i + 1] == assistant:
                return i
        raise ValueError("the thinker prompt has no '<|im_start|>assistant' turn to speak")

    def prefill_input(
        self, prompt_ids: list[int], head: list[int], speaker_id: int, media: dict | None = None
    ) -> tuple[torch.Tensor, torch.Tensor | None, int]:
        """(embeds [L, H], positions [3, L] or None for plain text positions, rope delta): user part +
        assistant head (``head``: the 4 first tokens of the assistant turn). With media the positions are the
        talker's own ``get_rope_index`` over its input ids (user ids + ``tts_pad`` for the head) and the media
        grids, as transformers' talker computes them; transformers' generate() hands its talker the grids
        but not ``use_audio_in_video``, so neither does this."""
        tc = self.config.talker_config
        user, user_ids = self.user_part(prompt_ids, media)
        text = self.project_text(head)
        text = torch.cat([text[:3], self.tts_pad.expand(4, -1), self.tts_bos.unsqueeze(0), text[3:4]], dim=0)
        codes = torch.tensor(
            [
                tc.codec_nothink_id,
                tc.codec_think_bos_id,
                tc.codec_think_eos_id,
                speaker_id,
                tc.codec_pad_id,
                tc.codec_bos_id,
            ],
            device=self.device,
        )
        codec = torch.cat([text.new_zeros(3, text.shape[-1]), self.talker.get_input_embeddings()(codes)], dim=0)
        embeds = torch.cat([user, text + codec], dim=0)
        if media is None or not any(t in self.media_id_set for t in user_ids):
            return embeds, None, 0
        ids = torch.tensor([user_ids + [self.config.tts_pad_token_id] * text.shape[0]], device=self.device)
        positions, delta = self.talker.get_rope_index(
            ids,
            _on(media.get("image_grid_thw"), self.device),
            _on(media.get("video_grid_thw"), self.device),
            torch.ones_like(ids),
            False,
            _on(media.get("audio_feature_lengths"), self.device),
            _on(media.get("video_second_per_grid"), self.device),
        )
        return embeds, positions[:, 0], int(delta.reshape(-1)[0])

    # ------------------------------------------------------------------ steps

    def _forward(
        self,
        rows: list[Qwen3TalkerRow],
        embeds: torch.Tensor,
        positions: torch.Tensor | None = None,
        lengths: list[int] | None = None,
    ) -> torch.Tensor:
        """One talker forward of ``embeds`` [B, T, H] (row i continues its own cache; ``positions`` [3, B, T]
        when given, else each row's next text positions; ``lengths``: row i's real tokens when the rows are
        right-padded to T); returns each row's last real position's normed hidden state [B, H]."""

        at = rope_delta_positions([r.rope_delta for r in rows], positions)
        return last_real(forward_rows(self.talker.model, [r.kv for r in rows], embeds, lengths, at), lengths)

    def _sample_code0(self, rows: list[Qwen3TalkerRow], hidden: torch.Tensor) -> None:
        logits = self.talker.codec_head(hidden).float()
        for i, row in enumerate(rows):
            code = sample(logits[i], row.sampling, row.history, self.suppress)
            row.history.append(code)
            row.code0 = code
            row.hidden = hidden[i]

    @torch.no_grad()
    def prefill(
        self, row: Qwen3TalkerRow, embeds: torch.Tensor, positions: torch.Tensor | None = None, rope_delta: int = 0
    ) -> None:
        """Run one request's prefill (``embeds`` [L, H]; ``positions`` [3, L], or None for text positions) and
        sample its first codebook-0 code; later steps sit at cache length + ``rope_delta`` on every axis."""
        self.prefill_batch([row], [(embeds, positions, rope_delta)])

    @torch.no_grad()
    def prefill_batch(
        self, rows: list[Qwen3TalkerRow], inputs: list[tuple[torch.Tensor, torch.Tensor | None, int]]
    ) -> None:
        """Several requests' prefills as one forward (``inputs[i]``: row i's ``prefill`` arguments), right-padded
        to the longest (``StepCache`` keeps each row's padding out of its cache and its attention)."""
        lengths = [embeds.shape[0] for embeds, _, _ in inputs]
        longest = max(lengths)
        batch = inputs[0][0].new_zeros(len(rows), longest, inputs[0][0].shape[-1])
        positions = torch.empty(3, len(rows), longest, dtype=torch.long, device=self.device)
        t = torch.arange(longest, device=self.device)
        for i, (row, (embeds, pos, delta)) in enumerate(zip(rows, inputs)):
            row.rope_delta = delta
            batch[i, : lengths[i]] = embeds
            if pos is None:  # text positions: 0.. on every axis
                positions[:, i] = t
            else:  # the row's M-RoPE positions, then (padding, never attended) counting on
                positions[:, i, : lengths[i]] = pos
                positions[:, i, lengths[i] :] = pos[:, -1:] + 1 + t[: longest - lengths[i]]
        self._sample_code0(rows, self._forward(rows, batch, positions, lengths))

    @torch.no_grad()
    def step(self, rows: list[Qwen3TalkerRow], texts: list[int | str]) -> torch.Tensor:
        """Complete each row's pending frame and sample the next codebook-0 code. ``texts[i]``: row i's
        trailing text item for this step. Returns the completed frames [B, G] (codebook 0 first)."""
        codes, summed = self.residuals(rows)
        text = torch.stack([self.text_input(x) for x in texts])
        hidden = self._forward(rows, (summed + text).unsqueeze(1))
        self._sample_code0(rows, hidden)
        return codes

    def residuals(self, rows: list[Qwen3TalkerRow]) -> tuple[torch.Tensor, torch.Tensor]:
        """The code predictor, batched: codebooks 1..G-1 of every row's pending frame; the frame [B, G] and
        the sum of its G codec embeddings [B, H] (the next talker input, before the text)."""
        predictor = self.talker.code_predictor
        code0 = torch.tensor([r.code0 for r in rows], device=self.device)
        first = self.talker.get_input_embeddings()(code0)  # [B, H]
        hidden = torch.stack([r.hidden for r in rows])
        cache = DynamicCache(config=predictor.config)
        x = torch.stack([hidden, first], dim=1)  # [B, 2, H]
        embeds = [first]
        codes = [code0]
        embedding = predictor.get_input_embeddings()
        for g in range(self.num_groups - 1):
            h = predictor.model(inputs_embeds=x, past_key_values=cache, use_cache=True).last_hidden_state[:, -1]
            logits = predictor.lm_head[g](h).float()
            nxt = torch.tensor(
                [sample(logits[i], r.sampling, None, None, predictor_defaults=True) for i, r in enumerate(rows)],
                device=self.device,
            )
            codes.append(nxt)
            emb = embedding[g](nxt)
            embeds.append(emb)
            x = emb.unsqueeze(1)
        summed = torch.stack(embeds, dim=1).sum(1)
        return torch.stack(codes, dim=1), summed


def _on(value, device: str) -> torch.Tensor | None:
    return None if value is None else torch.as_tensor(value).to(device)


def sample(
    logits: torch.Tensor,
    s: Sampling,
    history: list[int] | None,
    suppress: torch.Tensor | None,
    predictor_defaults: bool = False,
) -> int:
    """One token from float32 ``logits`` [V] in transformers' processor order (repetition penalty,
    suppressed tokens, temperature, top-k, top-p). The code predictor samples with transformers'
    defaults for it (top-k 50, top-p 0.8, temperature 1) whenever the talker samples."""
    scores = logits.clone()
    if history and s.repetition_penalty != 1.0:
        idx = torch.tensor(sorted(set(history)), device=scores.device)
        seen = scores[idx]
        scores[idx] = torch.where(seen < 0, seen * s.repetition_penalty, seen / s.repetition_penalty)
    if suppress is not None:
        scores = scores.masked_fill(suppress, float("-inf"))
    if s.greedy:
        return int(torch.argmax(scores))
    temperature, top_k, top_p = (1.0, 50, 0.8) if predictor_defaults else (s.temperature, s.top_k, s.top_p)
    return draw(scores, temperature, top_k, top_p, s.generator)

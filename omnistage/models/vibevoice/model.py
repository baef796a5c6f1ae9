"""VibeVoice's arithmetic over transformers' ``VibeVoiceForConditionalGeneration`` modules, batched over the
requests of one step.

What a step does for each request is transformers' ``VibeVoiceGenerationMixin._sample`` for one sequence, in
its order: the greedy token (with ``guidance_scale`` != 1 generate's token-level CFG first: an unconditional LM
over the token ids from the prompt's last on, log-softmax mixed; then the constraint to the speech tokens and
the end); on ``audio_bos`` the reset of the unconditional branch; on the speech token the unconditional
branch's step, the CFG diffusion loop (the request's own generator draws the noise, ``[2, latent]`` per frame
as transformers' ``torch.randn`` does, so a seed equals ``torch.manual_seed(seed)`` before ``generate``), the
acoustic decoder and the semantic encoder with their streaming caches; then the LM's forward for the next token.

Batching: each of the three LM branches (the token-level CFG branch, the unconditional branch, the positive
branch) is one forward over the rows that need it, each row on its own cache (``stages.ar.kv``: right-padded,
masked; the unconditional branch's reset is a per-row key mask); the diffusion head runs every speaking row of
one ``num_diffusion_steps`` in one batch (the scheduler is per-element, reset per frame as in transformers);
the decoder and semantic encoder run the speaking rows' stacked padding caches (``conv_cache``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from itertools import groupby
from pathlib import Path
from typing import Any

import torch

from omnistage.models.vibevoice import conv_cache
from omnistage.models.vibevoice.config import VibeVoiceParams
from omnistage.pipeline import read_json
from omnistage.stages.ar.kv import RequestKV, StepCache


@dataclass
class VoiceRow:
    """One request's state (touched only by the step thread while a step runs)."""

    params: VibeVoiceParams
    generator: torch.Generator
    pos: RequestKV
    neg: RequestKV
    text_uncond: RequestKV  # generate's token-level CFG (guidance_scale != 1): from the prompt's last token on
    neg_attend: torch.Tensor  # [neg length + 1] bool: which of the unconditional branch's slots its next step sees
    last_id: int = 0  # the newest token (the prompt's last at first): the token-level CFG branch's next input
    step_embeds: torch.Tensor | None = None  # the last step's input embedding [H]; None: the prompt's ids
    hidden: torch.Tensor | None = None  # the positive branch's last hidden state [H]
    logits: torch.Tensor | None = None  # [V] float32
    acoustic_cache: Any = None
    semantic_cache: Any = None


@dataclass
class StepResult:
    """Per row: the chosen token and the audio of its frame (None unless it is the speech token)."""

    tokens: list[int]
    audio: list[torch.Tensor | None] = field(default_factory=list)


class VibeVoiceModel:
    def __init__(self, folder: Path, device: str, dtype: torch.dtype):
        from transformers import AutoProcessor, AutoTokenizer, VibeVoiceForConditionalGeneration

        self.net = VibeVoiceForConditionalGeneration.from_pretrained(folder, dtype=dtype).to(device).eval()
        attention = self.net.model.language_model.config._attn_implementation
        if attention != "sdpa":  # the batched forwards pass boolean 4-D masks, which sdpa reads as such
            raise ValueError(f"VibeVoice's LM loaded with {attention!r} attention; the engine needs 'sdpa'")
        self.tokenizer = AutoTokenizer.from_pretrained(folder)
        # voice prompts need the processor (its feature extractor pads and normalises a clip); a folder without one
        # speaks scripts only
        has_processor = any((folder / n).exists() for n in ("processor_config.json", "preprocessor_config.json"))
        self.processor = AutoProcessor.from_pretrained(folder) if has_processor else None
        self.device = device
        c = self.net.config
        self.bos, self.eos_audio = c.audio_bos_token_id, c.audio_eos_token_id
        self.audio, self.eos = c.audio_token_id, c.eos_token_id
        self.allowed = torch.tensor(sorted({self.bos, self.eos_audio, self.audio, self.eos}), device=device)
        self.latent_size = c.audio_config.hidden_size
        self.text_config = c.get_text_config(decoder=True)
        self.num_layers = int(self.text_config.num_hidden_layers)
        self.max_positions = int(self.text_config.max_position_embeddings)
        self.scheduler = self._scheduler(read_json(folder / "generation_config.json"))

    @staticmethod
    def _scheduler(gen: Mapping[str, Any]) -> Any:
        import diffusers  # transformers' default scheduler is diffusers', named by the generation config

        name = gen.get("noise_scheduler_class") or "DPMSolverMultistepScheduler"
        cfg = gen.get("noise_scheduler_config") or {
            "beta_schedule": "squaredcos_cap_v2",
            "prediction_type": "v_prediction",
        }
        return getattr(diffusers, name)(**cfg)

    @property
    def voice_rate(self) -> int | None:
        """The sample rate voice clips are taken at (None: no voice prompts for this folder)."""
        return None if self.processor is None else int(self.processor.feature_extractor.sampling_rate)

    def prompt(self, turns: list[tuple[str, str]], voice: Any = None) -> tuple[list[int], torch.Tensor | None]:
        """The prompt's ids and, with a ``voice`` clip (mono float32 at ``voice_rate``) for the script's first
        speaker, the processor's ``input_values`` [1, 1, samples] (its chat template gives each voiced speaker one
        placeholder, widened to the clip's frames)."""
        if voice is None:
            conversation = [{"role": s, "content": t} for s, t in turns]
            ids = self.tokenizer.apply_chat_template(conversation, tokenize=True, return_dict=True)["input_ids"]
            return list(ids), None
        conversation = [
            {
                "role": s,
                "content": [{"type": "text", "text": t}] + ([{"type": "audio", "audio": voice}] if i == 0 else []),
            }
            for i, (s, t) in enumerate(turns)
        ]
        inputs = self.processor.apply_chat_template(conversation, tokenize=True, return_dict=True, return_tensors="pt")
        return inputs["input_ids"][0].tolist(), inputs["input_values"]

    def new_row(self, params: VibeVoiceParams, generator: torch.Generator) -> VoiceRow:
        return VoiceRow(
            params,
            generator,
            RequestKV(self.num_layers),
            RequestKV(self.num_layers),
            RequestKV(self.num_layers),
            torch.ones(1, dtype=torch.bool, device=self.device),
        )

    def _embed(self, ids: list[int]) -> torch.Tensor:
        return self.net.get_input_embeddings()(torch.tensor(ids, device=self.device))

    def _lm(
        self,
        kvs: list[RequestKV],
        embeds: torch.Tensor,
        counts: list[int] | None = None,
        attend: list[torch.Tensor] | None = None,
    ) -> torch.Tensor:
        """One LM forward of ``embeds`` [B, T, H], row i on its own cache (adding ``counts[i]`` tokens, all T by
        default) and, with ``attend``, seeing only the cached slots its bool vector marks."""
        cache = StepCache(kvs, counts if counts is not None else embeds.shape[1])
        t = torch.arange(embeds.shape[1], device=self.device)
        positions = torch.stack([s + t for s in cache.starts])
        mask = cache.mask(self.device)
        if attend is not None:
            seen = torch.zeros(len(kvs), cache.kv_len, dtype=torch.bool, device=self.device)
            for i, a in enumerate(attend):
                seen[i, : a.shape[0]] = a
            mask = mask & seen[:, None, None, :]
        out = self.net.model.language_model(
            inputs_embeds=embeds, attention_mask=mask, position_ids=positions, past_key_values=cache, use_cache=True
        )
        cache.commit()
        return out.last_hidden_state

    def _head(self, rows: list[VoiceRow], last_hidden: torch.Tensor) -> None:
        logits = self.net.lm_head(last_hidden).float()
        for i, r in enumerate(rows):
            r.hidden, r.logits = last_hidden[i], logits[i]

    @torch.inference_mode()
    def prompt_embeds(self, r: VoiceRow, ids: list[int], values: torch.Tensor | None) -> torch.Tensor:
        """A prompt's input embeddings [L, H]; a voice clip's frames take its placeholders, as transformers'
        ``get_audio_features``: the acoustic encoder's latents with its VAE noise (drawn from the request's
        generator, transformers' two ``randn`` calls in its order: the seed matches ``torch.manual_seed``),
        shifted, scaled and projected."""
        embeds = self._embed(ids)
        if values is None:
            return embeds
        net = self.net.model
        latents = net.audio_tower.encode(values.to(self.device, self.net.dtype), sample=False).latents
        std = net.audio_tower.config.vae_std * torch.randn(latents.shape[0], generator=r.generator)
        # randn_like keeps the latents' (transposed) strides, so its draws land in memory order: so do these
        noise = torch.empty_like(latents, device="cpu").normal_(generator=r.generator)
        latents = latents + (std[:, None, None] * noise).to(latents)
        features = net.multi_modal_projector((latents + net.latent_bias_factor) * net.latent_scaling_factor)[0]
        at = torch.tensor(ids, device=self.device) == self.audio
        embeds[at] = features[: int(at.sum())]
        return embeds

    @torch.inference_mode()
    def prefill(self, rows: list[VoiceRow], ids: list[list[int]], embeds: list[torch.Tensor]) -> None:
        """The prompts' forward (``prompt_embeds`` of each), right-padded into one batch."""
        counts = [len(x) for x in ids]
        width = max(counts)
        batch = torch.stack([torch.nn.functional.pad(e, (0, 0, 0, width - e.shape[0])) for e in embeds])
        hidden = self._lm([r.pos for r in rows], batch, counts)
        self._head(rows, torch.stack([hidden[i, n - 1] for i, n in enumerate(counts)]))
        for r, x in zip(rows, ids):
            r.last_id = x[-1]

    def _tokens(self, rows: list[VoiceRow]) -> list[int]:
        scores = torch.nn.functional.log_softmax(torch.stack([r.logits for r in rows]), dim=-1)
        cfg = [i for i, r in enumerate(rows) if r.params.guidance_scale != 1]
        if cfg:
            us = [rows[i] for i in cfg]
            hidden = self._lm([r.text_uncond for r in us], self._embed([r.last_id for r in us]).unsqueeze(1))
            uncond = torch.nn.functional.log_softmax(self.net.lm_head(hidden[:, -1]).float(), dim=-1)
            for j, i in enumerate(cfg):
                g = rows[i].params.guidance_scale
                scores[i] = g * (scores[i] - uncond[j]) + uncond[j]
        allowed = torch.full_like(scores, -float("inf"))
        allowed[:, self.allowed] = scores[:, self.allowed]
        tokens = torch.argmax(allowed, dim=-1).tolist()
        for r, token in zip(rows, tokens):
            r.last_id = token
        return tokens

    def _reset_negative(self, r: VoiceRow) -> None:
        """transformers' reset on audio_bos: attend only to the last slot, which gets the first slot's keys."""
        r.neg_attend = torch.zeros_like(r.neg_attend)
        r.neg_attend[-1] = True
        n = r.neg.length
        if n:  # (before the branch's first step there is nothing to reset)
            for layer in range(self.num_layers):
                r.neg.keys[layer][:, n - 1] = r.neg.keys[layer][:, 0]
                r.neg.values[layer][:, n - 1] = r.neg.values[layer][:, 0]

    @torch.inference_mode()
    def step(self, rows: list[VoiceRow], last: list[bool]) -> StepResult:
        """Every row's next token and, for the rows that do not end with it (not the end token, and not their
        ``last`` step), the positive branch's forward for the token after."""
        tokens = self._tokens(rows)
        result = StepResult(tokens, [None] * len(rows))
        going = [i for i, t in enumerate(tokens) if t != self.eos]
        if not going:
            return result
        embeds = self._embed([tokens[i] for i in going])  # [G, H]
        for i in going:
            if tokens[i] == self.bos:
                self._reset_negative(rows[i])
        speaking = [j for j, i in enumerate(going) if tokens[i] == self.audio]
        if speaking:
            sr = [rows[going[j]] for j in speaking]
            embeds[speaking], audio = self._frames(sr)
            for j, a in zip(speaking, audio):
                result.audio[going[j]] = a
        for j, i in enumerate(going):
            rows[i].step_embeds = embeds[j]
        on = [j for j, i in enumerate(going) if not last[i]]
        if on:
            on_rows = [rows[going[j]] for j in on]
            self._head(on_rows, self._lm([r.pos for r in on_rows], embeds[on].unsqueeze(1))[:, -1])
        return result

    def _frames(self, rows: list[VoiceRow]) -> tuple[torch.Tensor, list[torch.Tensor]]:
        """The speech token's work for ``rows``: the unconditional branch's step, the latents, their audio and
        the next step's input embeddings [B, H]."""
        net = self.net.model
        bos = self._embed([self.bos])[0]
        neg_in = torch.stack([r.step_embeds if r.step_embeds is not None else bos for r in rows]).unsqueeze(1)
        neg_hidden = self._lm([r.neg for r in rows], neg_in, attend=[r.neg_attend for r in rows])[:, -1]
        for r in rows:
            r.neg_attend = torch.cat([r.neg_attend, r.neg_attend.new_ones(1)])
        pos_hidden = torch.stack([r.hidden for r in rows])
        latent = torch.empty(len(rows), 1, self.latent_size, dtype=pos_hidden.dtype, device=self.device)
        order = sorted(range(len(rows)), key=lambda i: rows[i].params.num_diffusion_steps)
        for steps, group in groupby(order, key=lambda i: rows[i].params.num_diffusion_steps):
            idx = list(group)
            latent[idx] = self._latents([rows[i] for i in idx], pos_hidden[idx], neg_hidden[idx], steps)
        scaled = latent / net.latent_scaling_factor - net.latent_bias_factor
        decoded = net.audio_tower.decode(
            scaled, padding_cache=conv_cache.stack([r.acoustic_cache for r in rows]), use_cache=True
        )
        semantic = net.semantic_tokenizer_encoder(
            decoded.audio, use_cache=True, padding_cache=conv_cache.stack([r.semantic_cache for r in rows])
        )
        for r, a, s in zip(
            rows,
            conv_cache.split(decoded.padding_cache, len(rows)),
            conv_cache.split(semantic.padding_cache, len(rows)),
        ):
            r.acoustic_cache, r.semantic_cache = a, s
        embeds = net.multi_modal_projector(latent) + net.semantic_connector(semantic.latents)
        audio = [decoded.audio[i].reshape(-1).float().cpu() for i in range(len(rows))]
        return embeds[:, 0], audio

    def _latents(self, rows: list[VoiceRow], pos: torch.Tensor, neg: torch.Tensor, steps: int) -> torch.Tensor:
        """transformers' ``_sample_audio_latent`` over rows of one step count: CFG over the diffusion head, the
        batch laid out as transformers lays out its own ([positive rows; negative rows])."""
        head, k = self.net.model.diffusion_head, len(rows)
        condition = torch.cat([pos, neg], dim=0)
        noise = [torch.randn(2, self.latent_size, generator=r.generator) for r in rows]  # each request's own draw
        noisy = torch.cat([torch.stack([x[0] for x in noise]), torch.stack([x[1] for x in noise])]).to(condition)
        scales = {r.params.guidance_scale for r in rows}
        g: Any = (
            scales.pop()
            if len(scales) == 1
            else torch.tensor(
                [r.params.guidance_scale for r in rows], dtype=condition.dtype, device=self.device
            ).unsqueeze(1)
        )
        sched = self.scheduler  # per-element arithmetic; set_timesteps resets its multistep state every frame
        sched.set_timesteps(num_inference_steps=steps)
        for t in sched.timesteps:
            both = torch.cat([noisy[:k], noisy[:k]], dim=0)
            eps = head(both, t.repeat(2 * k).to(both), condition=condition)
            cond, uncond = torch.split(eps, k, dim=0)
            guided = uncond + g * (cond - uncond)
            noisy = sched.step(torch.cat([guided, guided], dim=0), t, noisy).prev_sample
        return noisy[:k].unsqueeze(1)

"""VibeVoice's one stage: ``stages.ar.StepEngine`` over transformers' ``VibeVoiceForConditionalGeneration``
modules; every step is one LM token and, when it is the speech token, one latent frame drawn by the diffusion
head and decoded to audio at once (the decoded audio feeds the next step through the semantic encoder, so the
decoder runs inside the step, and the stage emits audio itself).

What each step does is transformers' ``VibeVoiceGenerationMixin._sample`` for one sequence, in its order:
greedy token (restricted to the speech tokens and the end), then on ``audio_bos`` the reset of the
unconditional branch, on the speech token the unconditional branch's step, the CFG diffusion loop (the
request's own generator draws the noise, ``[2, latent]`` per frame as transformers' ``torch.randn`` does, so a
seed equals ``torch.manual_seed(seed)`` before ``generate``), the acoustic decoder with its streaming padding
cache and the semantic encoder with its own. Requests are stepped one by one inside a batch step: each keeps
its own caches (transformers' shapes for batch 1), which keeps every request equal to its solo run.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from omnistage.errors import InvalidRequestError
from omnistage.models.vibevoice.config import (
    SAMPLE_RATE,
    VibeVoiceParams,
    checkpoint_defaults,
    parse_params,
    script_turns,
)
from omnistage.pipeline import StageContext, read_json
from omnistage.stages.ar.engine import ARRequest, Emit, StepEngine
from omnistage.stages.base import StageRequest


@dataclass
class Branch:
    """One LM branch of one request: its KV cache and (the unconditional branch) its 2D attention mask."""

    cache: Any
    mask: torch.Tensor | None = None


@dataclass
class VoiceRequest(ARRequest):
    ids: list[int] = field(default_factory=list)
    params: VibeVoiceParams | None = None
    generator: torch.Generator | None = None
    pos: Branch | None = None
    neg: Branch | None = None
    text_uncond: Branch | None = None  # generate's token-level CFG (guidance_scale != 1): the last token alone
    last_id: int = 0  # the newest token (the prompt's last at first): the token-level CFG branch's next input
    step_embeds: torch.Tensor | None = None  # the positive branch's next input [1, 1, H]; None: the prompt's ids
    hidden: torch.Tensor | None = None  # the positive branch's last hidden state [1, H]
    logits: torch.Tensor | None = None
    acoustic_cache: Any = None
    semantic_cache: Any = None
    scheduler: Any = None


class VibeVoiceModel:
    """The checkpoint's modules and the per-step operations on one request."""

    def __init__(self, folder: Path, device: str, dtype: torch.dtype):
        from transformers import AutoTokenizer, VibeVoiceForConditionalGeneration

        self.net = VibeVoiceForConditionalGeneration.from_pretrained(folder, dtype=dtype).to(device).eval()
        self.tokenizer = AutoTokenizer.from_pretrained(folder)
        self.device = device
        c = self.net.config
        self.bos, self.eos_audio = c.audio_bos_token_id, c.audio_eos_token_id
        self.audio, self.eos = c.audio_token_id, c.eos_token_id
        self.allowed = torch.tensor(sorted({self.bos, self.eos_audio, self.audio, self.eos}), device=device)
        self.latent_size = c.audio_config.hidden_size
        self.text_config = c.get_text_config(decoder=True)
        self.max_positions = int(self.text_config.max_position_embeddings)
        self.scheduler = self._scheduler(read_json(folder / "generation_config.json"))

    @staticmethod
    def _scheduler(gen: Mapping[str, Any]) -> Any:
        import diffusers  # transformers' default scheduler is diffusers', named by the generation config

        name = gen.get("noise_scheduler_class") or "DPMSolverMultistepScheduler"
        cfg = gen.get("noise_scheduler_config") or {"beta_schedule": "squaredcos_cap_v2",
                                                    "prediction_type": "v_prediction"}
        return getattr(diffusers, name)(**cfg)

    def prompt_ids(self, turns: list[tuple[str, str]]) -> list[int]:
        conversation = [{"role": s, "content": t} for s, t in turns]
        return list(self.tokenizer.apply_chat_template(conversation, tokenize=True, return_dict=True)["input_ids"])

    def _lm(self, branch: Branch, embeds: torch.Tensor, position_ids: torch.Tensor | None) -> torch.Tensor:
        out = self.net.model.language_model(inputs_embeds=embeds, attention_mask=branch.mask, position_ids=position_ids,
                                            past_key_values=branch.cache, use_cache=True)
        return out.last_hidden_state

    @torch.inference_mode()
    def prefill(self, r: VoiceRequest) -> None:
        from transformers import DynamicCache

        ids = torch.tensor([r.ids], device=self.device)
        r.pos = Branch(DynamicCache(config=self.text_config))
        r.neg = Branch(DynamicCache(config=self.text_config), torch.ones(1, 1, dtype=torch.long, device=self.device))
        r.text_uncond = Branch(DynamicCache(config=self.text_config))
        r.last_id = r.ids[-1]
        positions = torch.arange(ids.shape[1], device=self.device).unsqueeze(0)
        hidden = self._lm(r.pos, self.net.get_input_embeddings()(ids), positions)
        self._head(r, hidden)
        r.scheduler = copy.deepcopy(self.scheduler)

    def _head(self, r: VoiceRequest, hidden: torch.Tensor) -> None:
        r.hidden = hidden[:, -1, :]
        r.logits = self.net.lm_head(hidden[:, -1:, :])[:, -1, :].float()

    @torch.inference_mode()
    def next_token(self, r: VoiceRequest) -> int:
        """generate's logits processors in its order, then argmax: with ``guidance_scale`` != 1 its generic
        token-level CFG (``UnbatchedClassifierFreeGuidanceLogitsProcessor``: an unconditional LM over the token ids
        from the prompt's last token on, log-softmax mixed), then VibeVoice's constraint to the speech tokens and
        the end."""
        scores = torch.nn.functional.log_softmax(r.logits, dim=-1)
        g = r.params.guidance_scale
        if g != 1:
            u = r.text_uncond
            u.mask = torch.ones(1, 1, dtype=torch.long, device=self.device) if u.mask is None else torch.cat(
                [u.mask, u.mask.new_ones((1, 1))], dim=1)
            embeds = self.net.get_input_embeddings()(torch.tensor([[r.last_id]], device=self.device))
            logits = self.net.lm_head(self._lm(u, embeds, None))[:, -1].float()
            uncond = torch.nn.functional.log_softmax(logits, dim=-1)
            scores = g * (scores - uncond) + uncond
        allowed = torch.full_like(scores, -float("inf"))
        allowed[:, self.allowed] = scores[:, self.allowed]
        token = int(torch.argmax(allowed, dim=-1))
        r.last_id = token
        return token

    def _reset_negative(self, r: VoiceRequest) -> None:
        """transformers' reset on audio_bos: attend only to the last slot, which gets the first slot's keys."""
        mask = torch.zeros_like(r.neg.mask)
        mask[:, -1] = 1
        r.neg.mask = mask
        for layer in r.neg.cache.layers:
            if layer.is_initialized and layer.keys.numel():  # a layer fills lazily, on its first update
                layer.keys[:, :, -1:, :] = layer.keys[:, :, 0:1, :]
                layer.values[:, :, -1:, :] = layer.values[:, :, 0:1, :]

    @torch.inference_mode()
    def advance(self, r: VoiceRequest, token: int, last: bool = False) -> torch.Tensor | None:
        """Everything after choosing ``token``: the next step's input, the audio of a speech token (else None),
        and (unless it is the ``last``) the positive branch's forward for the next token."""
        net = self.net
        next_embeds = net.get_input_embeddings()(torch.tensor([token], device=self.device)).unsqueeze(1)
        if token == self.bos:
            self._reset_negative(r)
        audio = None
        if token == self.audio:
            if r.step_embeds is None:  # right after the prompt: the unconditional branch starts from audio_bos alone
                neg_in = net.get_input_embeddings()(torch.tensor([[self.bos]], device=self.device))
            else:
                neg_in = r.step_embeds
            neg_hidden = self._lm(r.neg, neg_in, None)[:, -1, :]
            r.neg.mask = torch.cat([r.neg.mask, r.neg.mask.new_ones((1, 1))], dim=-1)
            latent = self._latent(r, r.hidden, neg_hidden)
            scaled = latent / net.model.latent_scaling_factor - net.model.latent_bias_factor
            decoded = net.model.audio_tower.decode(scaled, padding_cache=r.acoustic_cache, use_cache=True)
            r.acoustic_cache = decoded.padding_cache
            semantic = net.model.semantic_tokenizer_encoder(decoded.audio, padding_cache=r.semantic_cache,
                                                            use_cache=True)
            r.semantic_cache = semantic.padding_cache
            next_embeds = net.model.multi_modal_projector(latent) + net.model.semantic_connector(semantic.latents)
            audio = decoded.audio.reshape(-1).float().cpu()
        r.step_embeds = next_embeds
        if last:
            return audio
        past = r.pos.cache.get_seq_length()
        self._head(r, self._lm(r.pos, next_embeds, torch.tensor([[past]], device=self.device)))
        return audio

    def _latent(self, r: VoiceRequest, pos: torch.Tensor, neg: torch.Tensor) -> torch.Tensor:
        """transformers' ``_sample_audio_latent`` for one request: CFG over the diffusion head."""
        head, p = self.net.model.diffusion_head, r.params
        condition = torch.cat([pos, neg], dim=0)
        noisy = torch.randn(condition.shape[0], self.latent_size, generator=r.generator).to(condition)
        sched = r.scheduler
        sched.set_timesteps(num_inference_steps=p.num_diffusion_steps)
        for t in sched.timesteps:
            both = torch.cat([noisy[:1], noisy[:1]], dim=0)
            eps = head(both, t.repeat(2).to(both), condition=condition)
            cond, uncond = torch.split(eps, 1, dim=0)
            guided = uncond + p.guidance_scale * (cond - uncond)
            noisy = sched.step(torch.cat([guided, guided], dim=0), t, noisy).prev_sample
        return noisy[:1].unsqueeze(1)


class VibeVoiceEngine(StepEngine):
    def __init__(self, ctx: StageContext):
        if ctx.model is None:
            raise ValueError("vibevoice needs a model folder")
        super().__init__(ctx)
        self.folder = Path(ctx.model)
        self.defaults = checkpoint_defaults(self.folder)

    def load_model(self) -> VibeVoiceModel:
        return VibeVoiceModel(self.folder, *self.device_and_dtype())

    def new_request(self, req: StageRequest) -> VoiceRequest:
        if req.stream_inputs:
            raise ValueError(f"stage {self.stage_id} takes its whole input at once (no async chunk input)")
        params = parse_params(req.params, self.defaults)
        inputs = req.inputs or {}
        info = inputs.get("additional_information") or {}
        if not isinstance(info, Mapping):
            raise InvalidRequestError("additional_information", "expected an object")
        for name in ("voice", "speaker", "ref_audio", "instructions"):
            if info.get(name) is not None:  # voice prompts (a clip per speaker) are not served yet: say so
                raise InvalidRequestError(name, "VibeVoice here speaks scripts without voice prompts; speakers are "
                                          "'Speaker N:' lines in the input")
        steps = int(self.model.scheduler.config.num_train_timesteps)  # more cannot be scheduled (diffusers raises)
        if params.num_diffusion_steps > steps:
            raise InvalidRequestError("num_diffusion_steps", f"must be <= {steps}, got {params.num_diffusion_steps}")
        ids = self.model.prompt_ids(script_turns(inputs.get("prompt")))
        if len(ids) + params.max_tokens > self.model.max_positions:
            raise InvalidRequestError("max_tokens", f"the prompt ({len(ids)} tokens) plus max_tokens "
                                      f"({params.max_tokens}) exceed the model's {self.model.max_positions} positions")
        generator = torch.Generator()
        if params.seed is None:
            generator.seed()
        else:
            generator.manual_seed(params.seed)
        return VoiceRequest(req, ids=ids, params=params, generator=generator)

    def prefill(self, r: VoiceRequest) -> Emit:
        self.model.prefill(r)
        return Emit()

    def step(self, rs: list[VoiceRequest], items: list[Any]) -> list[Emit]:
        emits = []
        for r in rs:
            token = self.model.next_token(r)
            if token == self.model.eos:
                emits.append(Emit(finish="stop"))
                continue
            done = r.tokens + 1 >= r.params.max_tokens
            audio = self.model.advance(r, token, last=done)  # the last token's frame still sounds, as in generate
            data = {"audio": audio, "sample_rate": SAMPLE_RATE} if audio is not None else None
            emits.append(Emit(data, tokens=1, finish="length" if done else None))
        return emits


def build_engine(ctx: StageContext) -> VibeVoiceEngine:
    return VibeVoiceEngine(ctx)

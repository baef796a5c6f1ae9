"""The talker's arithmetic, as ``qwen-tts`` 0.1.1's ``Qwen3TTSForConditionalGeneration.generate`` does it,
over transformers' ``Qwen3Model`` (the talker and its code predictor are Qwen3 decoders: q/k-normed GQA
attention, SwiGLU; the talker's M-RoPE sees three equal position rows for text-only input, which is plain
RoPE) loaded from the published ``talker.*`` weights:

- **prompt** (``prompt``): [instruct turn] + ``<|im_start|>assistant\\n`` + (``tts_pad`` x n, ``tts_bos``)
  added to the codec control codes (``think``/``nothink``, ``think_bos``, [language], ``think_eos``,
  [speaker: a preset's codec embedding or a clone's x-vector], ``codec_pad``), then either the first text
  token + ``codec_bos`` (streamed text: the rest trails, one token per frame, then ``tts_eos``, then
  ``tts_pad``), or all the text + ``tts_eos`` over ``codec_pad`` and ``tts_pad`` + ``codec_bos``
  (non-streamed text), or for an in-context clone the reference text + target text over the reference
  codes (``icl``).
- **each step**: the code predictor completes the pending frame (codebooks 1..G-1 from the talker's last
  hidden state and codebook 0, through ``small_to_mtp_projection``), the next talker input is the sum of
  the frame's G codec embeddings plus the next trailing text embedding, and the talker samples the next
  codebook 0: repetition penalty over the request's codebook-0 history, the 1024 control ids suppressed
  except ``codec_eos`` (and ``codec_eos`` itself among the first ``MIN_NEW_TOKENS``), then greedy or
  temperature / top-k / top-p.

Several requests run as one batch per step (``stages.ar.kv.StepCache``); each row computes what it would
alone.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch import nn
from transformers import DynamicCache, Qwen3Config, Qwen3Model

from omnistage.models.qwen3_tts.config import MIN_NEW_TOKENS
from omnistage.models.shared.checkpoint import read_tensors
from omnistage.models.shared.step_forward import forward_rows, last_real
from omnistage.stages.ar.kv import RequestKV
from omnistage.stages.ar.params import TokenSampling
from omnistage.stages.ar.sampling import draw


@dataclass
class TTSRow:
    """One request's state in the talker (touched only by the step thread while a step runs)."""

    kv: RequestKV
    talker: TokenSampling
    sub: TokenSampling
    repetition_penalty: float
    generator: torch.Generator | None
    min_tokens: int = MIN_NEW_TOKENS  # codec_eos is suppressed until this many codebook-0 codes were drawn
    trailing: torch.Tensor | None = None  # text embeddings fed one per step [n, H], then tts_pad
    step: int = 0  # frames completed
    code0: int | None = None  # codebook 0 of the frame the next step completes
    hidden: torch.Tensor | None = None  # the talker's last normed hidden state [H]
    history: list[int] = field(default_factory=list)  # sampled codebook-0 codes


def _qwen3(cfg: dict, vocab: int) -> Qwen3Model:
    if cfg.get("use_sliding_window"):
        raise ValueError("Qwen3-TTS checkpoints with sliding-window attention in the talker are not supported")
    rope = dict(cfg.get("rope_scaling") or {})
    if rope.get("rope_type", rope.get("type", "default")) != "default":
        raise ValueError(f"talker rope_scaling {rope!r}: only the default RoPE is supported")
    config = Qwen3Config(
        vocab_size=vocab,
        hidden_size=cfg["hidden_size"],
        intermediate_size=cfg["intermediate_size"],
        num_hidden_layers=cfg["num_hidden_layers"],
        num_attention_heads=cfg["num_attention_heads"],
        num_key_value_heads=cfg["num_key_value_heads"],
        head_dim=cfg.get("head_dim"),
        hidden_act=cfg.get("hidden_act", "silu"),
        max_position_embeddings=cfg.get("max_position_embeddings", 32768),
        rms_norm_eps=cfg.get("rms_norm_eps", 1e-6),
        attention_bias=cfg.get("attention_bias", False),
        rope_parameters={"rope_type": "default", "rope_theta": float(cfg.get("rope_theta", 10000))},
    )
    config._attn_implementation = "sdpa"  # the engine passes boolean 4-D masks (padded per-request caches)
    return Qwen3Model(config)


class _Weights:
    """The checkpoint's ``talker.*`` tensors, handed out by prefix; every one must find its module."""

    def __init__(self, tensors: dict[str, torch.Tensor]):
        self.tensors, self.used = tensors, set()

    def take(self, prefix: str, but: str | None = None) -> dict[str, torch.Tensor]:
        out = {
            k[len(prefix) :]: v
            for k, v in self.tensors.items()
            if k.startswith(prefix) and not (but and k.startswith(prefix + but))
        }
        self.used.update(prefix + k for k in out)
        return out

    @staticmethod
    def load(module: nn.Module, state: dict[str, torch.Tensor], may_miss: tuple[str, ...] = ()) -> None:
        missing, unexpected = module.load_state_dict(state, strict=False)
        missing = [k for k in missing if not k.startswith(may_miss)]
        if missing or unexpected:
            raise ValueError(f"Qwen3-TTS talker weights: missing {missing[:4]}, unexpected {unexpected[:4]}")


class TextProjection(nn.Module):
    def __init__(self, dim: int, out: int):
        super().__init__()
        self.linear_fc1 = nn.Linear(dim, dim)
        self.linear_fc2 = nn.Linear(dim, out)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear_fc2(nn.functional.silu(self.linear_fc1(x)))


class TalkerModel:
    def __init__(self, folder: str | Path, device: str = "cpu", dtype: torch.dtype = torch.float32):
        folder = Path(folder)
        self.config = cfg = json.loads((folder / "config.json").read_text())
        tc = self.tc = cfg["talker_config"]
        cp = tc["code_predictor_config"]
        self.device, self.dtype = device, dtype
        self.num_groups = int(tc["num_code_groups"])
        self.vocab = int(tc["vocab_size"])
        self.codec_eos = int(tc["codec_eos_token_id"])
        self.num_layers = int(tc["num_hidden_layers"])
        self.max_positions = int(tc.get("max_position_embeddings", 32768))
        if tc.get("hidden_act", "silu") != "silu":
            raise ValueError(f"talker hidden_act {tc['hidden_act']!r}: only silu is supported")
        w = _Weights(read_tensors(folder, "talker."))
        hidden, cp_hidden, cp_vocab = int(tc["hidden_size"]), int(cp["hidden_size"]), int(cp["vocab_size"])
        self.lm = _qwen3(tc, self.vocab)  # its embed_tokens is the talker's codec embedding
        lm = w.take("model.", but="text_embedding")
        lm["embed_tokens.weight"] = lm.pop("codec_embedding.weight")
        w.load(self.lm, lm)
        text = w.take("model.text_embedding.")["weight"]
        self.text_embedding = nn.Embedding(*text.shape)
        w.load(self.text_embedding, {"weight": text})
        self.text_projection = TextProjection(int(tc["text_hidden_size"]), hidden)
        w.load(self.text_projection, w.take("text_projection."))
        self.codec_head = nn.Linear(hidden, self.vocab, bias=False)
        w.load(self.codec_head, w.take("codec_head."))
        self.predictor = _qwen3(cp, cp_vocab)  # its embed_tokens is unused: frames are embedded below
        w.load(self.predictor, w.take("code_predictor.model.", but="codec_embedding"), may_miss=("embed_tokens.",))
        g = self.num_groups - 1
        self.predictor_embeddings = nn.ModuleList(nn.Embedding(cp_vocab, hidden) for _ in range(g))
        w.load(self.predictor_embeddings, w.take("code_predictor.model.codec_embedding."))
        self.predictor_heads = nn.ModuleList(nn.Linear(cp_hidden, cp_vocab, bias=False) for _ in range(g))
        w.load(self.predictor_heads, w.take("code_predictor.lm_head."))
        # the 1.7B talker is wider than its code predictor; the 0.6B one is not (no projection weights)
        self.to_predictor: nn.Module = nn.Linear(hidden, cp_hidden) if cp_hidden != hidden else nn.Identity()
        w.load(self.to_predictor, w.take("code_predictor.small_to_mtp_projection."))
        left = sorted(set(w.tensors) - w.used)
        if left:
            raise ValueError(f"{folder}: talker weights this implementation does not know: {left[:4]}")
        for m in self._modules():
            m.to(device=device, dtype=dtype).eval()
        self.suppress = torch.zeros(self.vocab, dtype=torch.bool, device=device)
        self.suppress[self.vocab - 1024 :] = True  # control ids are never sampled, except the end of speech
        self.suppress[self.codec_eos] = False
        with torch.no_grad():
            bos, eos, pad = self.project_text(
                [cfg["tts_bos_token_id"], cfg["tts_eos_token_id"], cfg["tts_pad_token_id"]]
            )
        self.tts_bos, self.tts_eos, self.tts_pad = bos, eos, pad

    def _modules(self) -> list[nn.Module]:
        return [
            self.lm,
            self.text_embedding,
            self.text_projection,
            self.codec_head,
            self.predictor,
            self.predictor_embeddings,
            self.predictor_heads,
            self.to_predictor,
        ]

    # ------------------------------------------------------------------ inputs

    def project_text(self, ids: list[int] | torch.Tensor) -> torch.Tensor:
        """Text token ids -> talker inputs [n, H]."""
        ids = torch.as_tensor(ids, device=self.device).view(-1)
        return self.text_projection(self.text_embedding(ids))

    def codec(self, ids: list[int]) -> torch.Tensor:
        return self.lm.embed_tokens(torch.tensor(ids, device=self.device))

    def frame_embeddings(self, codes: torch.Tensor) -> torch.Tensor:
        """Frames [T, G] -> the sums of their G codec embeddings [T, H]."""
        codes = codes.to(self.device)
        total = self.lm.embed_tokens(codes[:, 0])
        for g in range(1, self.num_groups):
            total = total + self.predictor_embeddings[g - 1](codes[:, g])
        return total

    @torch.no_grad()
    def prompt(
        self,
        ids: list[int],
        *,
        instruct_ids: list[int] | None,
        language_id: int | None,
        speaker: torch.Tensor | None,
        non_streaming: bool,
        ref_ids: list[int] | None = None,
        ref_codes: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(prefill inputs [L, H], trailing text [n, H]). ``ids``: the tokenized assistant turn
        (``<|im_start|>assistant\\n{text}<|im_end|>\\n<|im_start|>assistant\\n``); ``ref_ids`` (the reference
        turn ``<|im_start|>assistant\\n{ref_text}<|im_end|>\\n``) and ``ref_codes`` [T, G]: an in-context clone."""
        tc = self.tc
        think = (
            [tc["codec_nothink_id"], tc["codec_think_bos_id"], tc["codec_think_eos_id"]]
            if language_id is None
            else [tc["codec_think_id"], tc["codec_think_bos_id"], language_id, tc["codec_think_eos_id"]]
        )
        control = [self.codec(think)]
        if speaker is not None:
            control.append(speaker.to(self.device, self.dtype).view(1, -1))
        control.append(self.codec([tc["codec_pad_id"], tc["codec_bos_id"]]))
        control = torch.cat(control)
        n = control.shape[0]
        head = torch.cat([self.tts_pad.expand(n - 2, -1), self.tts_bos.unsqueeze(0)]) + control[:-1]
        parts = [self.project_text(instruct_ids)] if instruct_ids else []
        parts += [self.project_text(ids[:3]), head]
        text = ids[3:-5]
        if ref_codes is not None:
            body, trailing = self._icl(ref_ids[3:-2] + text, ref_codes, non_streaming)
            parts.append(body)
        elif non_streaming:
            all_text = torch.cat([self.project_text(text), self.tts_eos.unsqueeze(0)])
            parts += [
                all_text + self.codec([tc["codec_pad_id"]] * all_text.shape[0]),
                self.tts_pad.unsqueeze(0) + control[-1:],
            ]
            trailing = self.tts_pad.unsqueeze(0)
        else:
            parts.append(self.project_text(text[:1]) + control[-1:])
            trailing = torch.cat([self.project_text(text[1:]), self.tts_eos.unsqueeze(0)])
        return torch.cat(parts), trailing

    def _icl(
        self, text_ids: list[int], ref_codes: torch.Tensor, non_streaming: bool
    ) -> tuple[torch.Tensor, torch.Tensor]:
        tc = self.tc
        text = torch.cat([self.project_text(text_ids), self.tts_eos.unsqueeze(0)])
        codec = torch.cat([self.codec([tc["codec_bos_id"]]), self.frame_embeddings(ref_codes)])
        pad = self.tts_pad.unsqueeze(0)
        if non_streaming:
            body = torch.cat([text + self.codec([tc["codec_pad_id"]] * text.shape[0]), codec + pad])
            return body, pad
        if text.shape[0] > codec.shape[0]:
            return text[: codec.shape[0]] + codec, text[codec.shape[0] :]
        padded = torch.cat([text, pad.expand(codec.shape[0] - text.shape[0], -1)])
        return padded + codec, pad

    # ------------------------------------------------------------------ steps

    def _forward(self, rows: list[TTSRow], embeds: torch.Tensor, lengths: list[int] | None = None) -> torch.Tensor:
        """One talker forward of ``embeds`` [B, T, H] (row i continues its own cache; ``lengths``: row i's real
        tokens when right-padded to T); each row's last real position's normed hidden state [B, H]."""
        return last_real(forward_rows(self.lm, [r.kv for r in rows], embeds, lengths), lengths)

    def _sample_code0(self, rows: list[TTSRow], hidden: torch.Tensor) -> None:
        logits = self.codec_head(hidden).float()
        for i, row in enumerate(rows):
            scores = logits[i].clone()
            if row.history and row.repetition_penalty != 1.0:
                idx = torch.tensor(sorted(set(row.history)), device=scores.device)
                seen = scores[idx]
                scores[idx] = torch.where(seen < 0, seen * row.repetition_penalty, seen / row.repetition_penalty)
            suppress = self.suppress
            if len(row.history) < row.min_tokens:
                suppress = suppress.clone()
                suppress[self.codec_eos] = True
            scores = scores.masked_fill(suppress, float("-inf"))
            s = row.talker
            code = draw(scores, s.temperature, s.top_k, s.top_p, row.generator)
            row.history.append(code)
            row.code0 = code
            row.hidden = hidden[i]

    @torch.no_grad()
    def prefill_batch(self, rows: list[TTSRow], embeds: list[torch.Tensor]) -> None:
        """Several requests' prefills as one forward, right-padded to the longest; samples each first code."""
        lengths = [e.shape[0] for e in embeds]
        batch = embeds[0].new_zeros(len(rows), max(lengths), embeds[0].shape[-1])
        for i, e in enumerate(embeds):
            batch[i, : lengths[i]] = e
        self._sample_code0(rows, self._forward(rows, batch, lengths))

    @torch.no_grad()
    def frames(self, rows: list[TTSRow]) -> torch.Tensor:
        """The code predictor over all rows: each row's pending frame [B, G] (codebook 0 first)."""
        code0 = torch.tensor([r.code0 for r in rows], device=self.device)
        hidden = torch.stack([r.hidden for r in rows])
        x = self.to_predictor(torch.stack([hidden, self.lm.embed_tokens(code0)], dim=1))  # [B, 2, h]
        cache = DynamicCache(config=self.predictor.config)
        codes = [code0]
        for g in range(self.num_groups - 1):
            h = self.predictor(inputs_embeds=x, past_key_values=cache, use_cache=True).last_hidden_state[:, -1]
            logits = self.predictor_heads[g](h).float()
            nxt = torch.tensor(
                [draw(logits[i], r.sub.temperature, r.sub.top_k, r.sub.top_p, r.generator) for i, r in enumerate(rows)],
                device=self.device,
            )
            codes.append(nxt)
            x = self.to_predictor(self.predictor_embeddings[g](nxt)).unsqueeze(1)
        return torch.stack(codes, dim=1)

    @torch.no_grad()
    def advance(self, rows: list[TTSRow], frames: torch.Tensor) -> None:
        """Feed each row's completed frame [B, G] + its next trailing text; sample the next codebook 0."""
        text = []
        for r in rows:
            text.append(r.trailing[r.step] if r.trailing is not None and r.step < r.trailing.shape[0] else self.tts_pad)
            r.step += 1
        embeds = self.frame_embeddings(frames) + torch.stack(text)
        self._sample_code0(rows, self._forward(rows, embeds.unsqueeze(1)))

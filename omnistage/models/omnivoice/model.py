"""OmniVoice's code generator at inference: the prompt (style tokens, text, an optional reference clip's codes,
then the target frames all masked) and the iterative unmasking with classifier-free guidance, for several
requests in one forward.

Each step runs the bidirectional Qwen3 backbone once over every request's conditional row (the whole prompt)
and unconditional row (the target frames alone), takes the guided log-probabilities, predicts every masked
code greedily and keeps the ``k`` most confident ones (a layer penalty favours the first codebooks; Gumbel
noise at the position temperature breaks ties), ``k`` following the request's own time-shifted schedule.
Requests at different steps and of different lengths share a forward: rows are padded and the attention mask
keeps each row to its own positions, so a request's codes do not depend on what it was batched with. Its
noise comes from its own generator, drawn in the order the reference draws from the global one, so a
request seeded ``s`` equals ``omnivoice``'s ``generate`` after ``torch.manual_seed(s)``.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from omnistage.models.omnivoice.config import (
    GUIDANCE_SCALE,
    LAYER_PENALTY_FACTOR,
    NUM_STEP,
    POSITION_TEMPERATURE,
    T_SHIFT,
)
from omnistage.models.shared.checkpoint import read_tensors

# the release's non-verbal tags: each is tokenized on its own, so its ids do not depend on the text around it
_NONVERBAL = re.compile(
    r"\[(laughter|sigh|confirmation-en|question-en|question-ah|question-oh|question-ei|question-yi|"
    r"surprise-ah|surprise-oh|surprise-wa|surprise-yo|dissatisfaction-hnn)\]"
)
_CJK = r"[\u4e00-\u9fff]"


def join_text(text: str, ref_text: str | None = None) -> str:
    """The spoken text as the model reads it: the reference transcript first (cloning), one line, single
    spaces, ASCII parentheses, no spaces next to CJK characters."""
    full = f"{ref_text.strip()} {text.strip()}" if ref_text else text.strip()
    full = re.sub(r"[\r\n]+", "", full).replace("\uff08", "(").replace("\uff09", ")")
    full = re.sub(r"[ \t]+", " ", full)
    return re.sub(rf"(?<={_CJK})\s+|\s+(?={_CJK})", "", full)


def schedule(target_len: int, codebooks: int, num_step: int, t_shift: float) -> list[int]:
    """Codes to unmask at each step: the time-shifted share of all ``target_len * codebooks``, the rest last."""
    t = torch.linspace(0.0, 1.0, num_step + 1)
    t = (t_shift * t / (1 + (t_shift - 1) * t)).tolist()
    total = remaining = target_len * codebooks
    out = []
    for s in range(num_step):
        n = remaining if s == num_step - 1 else min(math.ceil(total * (t[s + 1] - t[s])), remaining)
        out.append(int(n))
        remaining -= int(n)
    return out


@dataclass
class CodeRequest:
    """One utterance being unmasked: its prompt row, its schedule and its generator."""

    prompt: torch.Tensor  # [C, prompt_len] long: style, text, reference codes, target (mask ids)
    audio_start: int  # first audio position of the prompt (the reference clip's, else the target's)
    target_len: int
    steps: list[int]  # codes unmasked at each step
    generator: torch.Generator
    guidance_scale: float = GUIDANCE_SCALE
    layer_penalty: float = LAYER_PENALTY_FACTOR
    position_temperature: float = POSITION_TEMPERATURE
    step: int = 0
    codes: torch.Tensor = field(init=False)  # [C, target_len], mask ids until unmasked

    def __post_init__(self) -> None:
        self.codes = self.prompt[:, -self.target_len :].clone()

    @property
    def done(self) -> bool:
        return self.step >= len(self.steps)


class OmniVoiceCodes(nn.Module):
    """The backbone, the summed per-codebook audio embeddings and the audio heads of an OmniVoice folder."""

    def __init__(self, folder: str | Path, device: str = "cpu", dtype: torch.dtype = torch.float32):
        super().__init__()
        from transformers import AutoConfig, AutoModel, AutoTokenizer

        from omnistage.pipeline import read_json

        folder = Path(folder)
        cfg = read_json(folder / "config.json")
        llm = dict(cfg["llm_config"])
        llm_config = AutoConfig.for_model(llm.pop("model_type"), **llm)
        llm_config._attn_implementation = "sdpa"
        self.codebooks = int(cfg.get("num_audio_codebook", 8))
        self.vocab = int(cfg.get("audio_vocab_size", 1025))
        self.mask_id = int(cfg.get("audio_mask_id", 1024))
        self.llm = AutoModel.from_config(llm_config)
        self.llm.load_state_dict(read_tensors(folder, "llm."), strict=True)
        hidden = llm_config.hidden_size
        self.audio_embeddings = nn.Embedding(self.codebooks * self.vocab, hidden)
        self.audio_heads = nn.Linear(hidden, self.codebooks * self.vocab, bias=False)
        rest = read_tensors(folder, "")
        self.audio_embeddings.load_state_dict({"weight": rest["audio_embeddings.weight"]})
        self.audio_heads.load_state_dict({"weight": rest["audio_heads.weight"]})
        self.register_buffer("offsets", torch.arange(self.codebooks) * self.vocab)
        self.to(device=device, dtype=dtype).eval()
        self.device = torch.device(device)
        self.tokenizer = AutoTokenizer.from_pretrained(str(folder))

    # -- prompt ---------------------------------------------------------------------------------------

    def _text_ids(self, text: str) -> list[int]:
        ids, last = [], 0
        for m in _NONVERBAL.finditer(text):
            ids += (
                self.tokenizer(text[last : m.start()], add_special_tokens=False).input_ids if m.start() > last else []
            )
            ids += self.tokenizer(m.group(), add_special_tokens=False).input_ids
            last = m.end()
        if last < len(text):
            ids += self.tokenizer(text[last:], add_special_tokens=False).input_ids
        return ids or self.tokenizer(text).input_ids

    def prompt(
        self,
        text: str,
        target_len: int,
        *,
        language: str | None = None,
        instruct: str | None = None,
        ref_text: str | None = None,
        ref_codes: torch.Tensor | None = None,
        denoise: bool = True,
    ) -> tuple[torch.Tensor, int]:
        """The conditional prompt [C, n] and its first audio position. ``language`` is a language id
        (``en``), ``instruct`` a normalised voice-design string, ``ref_codes`` [C, T] a reference clip's."""
        style = "<|denoise|>" if denoise and ref_codes is not None else ""
        style += f"<|lang_start|>{language or 'None'}<|lang_end|><|instruct_start|>{instruct or 'None'}<|instruct_end|>"
        ids = self.tokenizer(style).input_ids + self._text_ids(f"<|text_start|>{join_text(text, ref_text)}<|text_end|>")
        parts = [torch.tensor(ids, dtype=torch.long).expand(self.codebooks, -1)]
        if ref_codes is not None:
            parts.append(ref_codes.to(torch.long).cpu())
        parts.append(torch.full((self.codebooks, target_len), self.mask_id, dtype=torch.long))
        prompt = torch.cat(parts, dim=1)
        ref_len = 0 if ref_codes is None else ref_codes.shape[-1]
        return prompt, prompt.shape[1] - target_len - ref_len

    def new_request(
        self,
        prompt: torch.Tensor,
        audio_start: int,
        target_len: int,
        *,
        seed: int,
        num_step: int = NUM_STEP,
        t_shift: float = T_SHIFT,
        **knobs,
    ) -> CodeRequest:
        return CodeRequest(
            prompt=prompt.clone(),
            audio_start=audio_start,
            target_len=target_len,
            steps=schedule(target_len, self.codebooks, num_step, t_shift),
            generator=torch.Generator().manual_seed(seed),
            **knobs,
        )

    # -- one unmasking step for several requests -------------------------------------------------------

    def _logits(self, ids: torch.Tensor, audio_mask: torch.Tensor, attention: torch.Tensor) -> torch.Tensor:
        text = self.llm.get_input_embeddings()(ids[:, 0, :])
        audio = self.audio_embeddings(ids * audio_mask.unsqueeze(1) + self.offsets.view(1, -1, 1)).sum(dim=1)
        embeds = torch.where(audio_mask.unsqueeze(-1), audio, text)
        hidden = self.llm(inputs_embeds=embeds, attention_mask=attention, return_dict=True)[0]
        b, n, _ = hidden.shape
        return self.audio_heads(hidden).view(b, n, self.codebooks, self.vocab).permute(0, 2, 1, 3).float()

    @torch.inference_mode()
    def step(self, requests: list[CodeRequest]) -> None:
        """Advance every request by one unmasking step, in one forward."""
        b = len(requests)
        width = max(r.prompt.shape[1] for r in requests)
        dev = self.device
        ids = torch.full((2 * b, self.codebooks, width), self.mask_id, dtype=torch.long, device=dev)
        audio_mask = torch.zeros((2 * b, width), dtype=torch.bool, device=dev)
        # padded positions attend to themselves only (no row is fully masked); real ones to their own row
        attention = torch.eye(width, dtype=torch.bool, device=dev).repeat(2 * b, 1, 1, 1)
        for i, r in enumerate(requests):
            n, t = r.prompt.shape[1], r.target_len
            ids[i, :, :n] = r.prompt
            audio_mask[i, r.audio_start : n] = True
            attention[i, :, :n, :n] = True
            ids[b + i, :, :t] = r.prompt[:, -t:]
            audio_mask[b + i, :t] = True
            attention[b + i, :, :t, :t] = True
        logits = self._logits(ids, audio_mask, attention)
        layer = torch.arange(self.codebooks, device=dev).view(1, -1, 1)
        for i, r in enumerate(requests):
            k = r.steps[r.step]
            r.step += 1
            if k <= 0:
                continue
            n, t = r.prompt.shape[1], r.target_len
            cond = F.log_softmax(logits[i : i + 1, :, n - t : n], dim=-1)
            if r.guidance_scale != 0:
                uncond = F.log_softmax(logits[b + i : b + i + 1, :, :t], dim=-1)
                log_probs = torch.log_softmax(cond + r.guidance_scale * (cond - uncond), dim=-1)
            else:
                log_probs = cond
            log_probs[..., self.mask_id] = -float("inf")
            predicted = log_probs.argmax(dim=-1)
            scores = log_probs.max(dim=-1)[0] - layer * r.layer_penalty
            if r.position_temperature > 0.0:
                u = torch.rand(scores.shape, generator=r.generator).to(dev)
                scores = scores / r.position_temperature - torch.log(-torch.log(u + 1e-10) + 1e-10)
            current = r.codes.unsqueeze(0).to(dev)
            scores = scores.masked_fill(current != self.mask_id, -float("inf"))
            pick = torch.topk(scores.flatten(), k).indices
            flat = current.flatten().clone()
            flat[pick] = predicted.flatten()[pick]
            r.codes = flat.view(self.codebooks, t).cpu()
            r.prompt[:, n - t :] = r.codes

    def generate(self, requests: list[CodeRequest]) -> list[torch.Tensor]:
        """Run requests to the end together (those with fewer steps leave the batch early): codes [C, T]."""
        live = list(requests)
        while live:
            self.step(live)
            live = [r for r in live if not r.done]
        return [r.codes for r in requests]

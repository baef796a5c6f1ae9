"""Moshi's language model at inference: the temporal transformer (one step per 80 ms frame over the text token
plus 16 audio codes: the model's 8 and the user's 8) and the depth transformer that draws the frame's 8 model codes
one after another. Modules carry the authors' parameter names (moshi's ``LMModel``), so their checkpoint loads as
it is.

Every session's state lives in slots (``LMSlots``): its temporal KV cache as a ring of the attention window (the
authors' ``RingKVCache`` layout, so that attention sums the same terms in the same order), its step offset and its
token ring (the delay pattern: the user's codes are written ``delay`` steps ahead, the model's read back
``max_delay`` steps later). One ``step`` runs any set of slots as one batch.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from omnistage.models.moshi.config import LMConfig


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float, f32: bool):
        super().__init__()
        self.eps, self.f32 = eps, f32
        self.alpha = nn.Parameter(torch.ones(1, 1, dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        if self.f32:
            x = x.float()
        var = self.eps + torch.mean(x**2, dim=2, keepdim=True)
        return (x * (self.alpha.to(var) * torch.rsqrt(var))).to(dtype)


def make_norm(kind: str, dim: int) -> RMSNorm:
    if kind == "rms_norm_f32":
        return RMSNorm(dim, 1e-8, True)
    if kind == "rms_norm":
        return RMSNorm(dim, 1e-5, False)
    raise ValueError(f"moshi: norm {kind!r} is not supported (rms_norm, rms_norm_f32)")


class Gating(nn.Module):
    """SiLU-gated feed-forward: one input projection holding both halves."""

    def __init__(self, dim: int, hidden: int):
        super().__init__()
        self.linear_in = nn.Linear(dim, 2 * hidden, bias=False)
        self.linear_out = nn.Linear(hidden, dim, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.linear_in(x)
        x = x.view(*x.shape[:2], 2, -1)
        return self.linear_out(F.silu(x[..., 0, :]) * x[..., 1, :])


class Attention(nn.Module):
    def __init__(self, dim: int, heads: int, mult: int):
        super().__init__()
        self.heads = heads
        self.in_projs = nn.ModuleList([nn.Linear(dim, 3 * dim, bias=False) for _ in range(mult)])
        self.out_projs = nn.ModuleList([nn.Linear(dim, dim, bias=False) for _ in range(mult)])

    def qkv(self, x: torch.Tensor, step: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """x [B, 1, dim] -> q, k, v [B, heads, 1, head_dim]."""
        b = x.shape[0]
        q, k, v = self.in_projs[step](x).view(b, 1, 3, self.heads, -1).permute(2, 0, 3, 1, 4)
        return q, k, v


class Layer(nn.Module):
    def __init__(self, dim: int, heads: int, hidden: int, norm: str, steps: int):
        super().__init__()
        self.norm1, self.norm2 = make_norm(norm, dim), make_norm(norm, dim)
        self.self_attn = Attention(dim, heads, max(steps, 1))
        self.gating: nn.Module = (
            nn.ModuleList([Gating(dim, hidden) for _ in range(steps)]) if steps else Gating(dim, hidden)
        )

    def ff(self, x: torch.Tensor, step: int) -> torch.Tensor:
        gating = self.gating[step] if isinstance(self.gating, nn.ModuleList) else self.gating
        return x + gating(self.norm2(x))


class Stack(nn.Module):
    def __init__(self, dim: int, heads: int, layers: int, hidden: int, norm: str, steps: int = 0):
        super().__init__()
        self.layers = nn.ModuleList([Layer(dim, heads, hidden, norm, steps) for _ in range(layers)])


def gating_hidden(dim: int, dim_feedforward: int) -> int:
    """The authors' gated FFN width for a nominal ``dim_feedforward`` (8/3 of it, or 21/8 dim at 4x)."""
    return (21 * dim) // 8 if dim_feedforward == 4 * dim else (2 * dim_feedforward) // 3


def rope(x: torch.Tensor, positions: torch.Tensor, max_period: float) -> torch.Tensor:
    """Interleaved rotary embedding of x [B, H, 1, D] at positions [B] (float32 math, as the authors')."""
    d = x.shape[-1]
    freqs = torch.exp(torch.arange(d // 2, device=x.device, dtype=torch.float32) * (-math.log(max_period) * 2 / d))
    angles = freqs * positions.float().view(-1, 1, 1, 1)
    cos, sin = torch.cos(angles), torch.sin(angles)
    pairs = x.view(*x.shape[:-1], d // 2, 2)
    re, im = pairs[..., 0].float(), pairs[..., 1].float()
    out = torch.stack([(re * cos - im * sin).to(x.dtype), (re * sin + im * cos).to(x.dtype)], dim=-1)
    return out.view(x.shape)


@dataclass
class Sampling:
    """One session's sampling: temperature 0 is greedy (argmax); else softmax(logits / temp) over the top k,
    drawn with the authors' exponential trick from the session's generator."""

    temp: float = 0.0
    top_k: int = 0
    temp_text: float = 0.0
    top_k_text: int = 0
    generator: torch.Generator | None = None


def draw(logits: torch.Tensor, temp: float, top_k: int, generator: torch.Generator | None) -> int:
    if temp <= 0:
        return int(torch.argmax(logits))
    probs = torch.softmax(logits / temp, dim=-1)
    indices = None
    if top_k > 0:
        probs, indices = torch.topk(probs, min(top_k, probs.shape[-1]), dim=-1)
    q = torch.empty_like(probs).exponential_(1, generator=generator)
    choice = int((probs / q).argmax())
    return choice if indices is None else int(indices[choice])


class MoshiLM(nn.Module):
    def __init__(self, cfg: LMConfig):
        super().__init__()
        self.cfg = cfg
        dim, ddim = cfg.dim, cfg.depformer_dim
        self.emb = nn.ModuleList([nn.Embedding(cfg.card + 1, dim) for _ in range(cfg.n_q)])
        self.text_emb = nn.Embedding(cfg.text_card + 1, dim)
        self.text_linear = nn.Linear(dim, cfg.text_card, bias=False)
        hidden = gating_hidden(dim, int(cfg.hidden_scale * dim))
        self.transformer = Stack(dim, cfg.num_heads, cfg.num_layers, hidden, cfg.norm)
        self.out_norm = make_norm(cfg.norm, dim)
        self.depformer_in = nn.ModuleList([nn.Linear(dim, ddim, bias=False) for _ in range(cfg.dep_q)])
        self.depformer_emb = nn.ModuleList([nn.Embedding(cfg.card + 1, ddim) for _ in range(cfg.dep_q - 1)])
        self.depformer_text_emb = nn.Embedding(cfg.text_card + 1, ddim)
        dhidden = gating_hidden(ddim, cfg.depformer_dim_feedforward)
        self.depformer = Stack(
            ddim, cfg.depformer_num_heads, cfg.depformer_num_layers, dhidden, cfg.norm, steps=cfg.dep_q
        )
        self.linears = nn.ModuleList([nn.Linear(ddim, cfg.card, bias=False) for _ in range(cfg.dep_q)])

    @staticmethod
    def embed(table: nn.Embedding, tokens: torch.Tensor) -> torch.Tensor:
        """The authors' ``ScaledEmbedding``: token -1 embeds to zeros."""
        return torch.where((tokens == -1)[..., None], 0.0, table(tokens.clamp(min=0)))

    # ------------------------------------------------------------------ temporal step

    def temporal(
        self,
        tokens: torch.Tensor,
        kv: torch.Tensor,
        offsets: torch.Tensor,
        replay: tuple[torch.Tensor, torch.Tensor] | None = None,
        window: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """One step of B sessions: tokens [B, 1 + n_q], their KV rings kv [B, L, 2, H, C, Dh] (updated in place)
        and offsets [B] -> the transformer output [B, 1, dim]. ``replay`` (rows [B] bool, inputs [B, dim]) gives
        some rows their input embedding instead; ``window`` [B] narrows a row's attention to that many steps."""
        x = self.embed(self.text_emb, tokens[:, 0])
        for k in range(self.cfg.n_q):
            x = x + self.embed(self.emb[k], tokens[:, 1 + k])
        if replay is not None:
            x = torch.where(replay[0].view(-1, 1), replay[1].to(x), x)
        x = x[:, None]
        capacity = kv.shape[4]
        rows = torch.arange(x.shape[0], device=x.device)
        slot = offsets % capacity
        ring = torch.arange(capacity, device=x.device).view(1, -1)
        positions = offsets.view(-1, 1) - ((slot.view(-1, 1) - ring) % capacity)  # each ring entry's position
        mask = positions >= 0  # the ring holds exactly the attention window
        if window is not None:
            mask = mask & (offsets.view(-1, 1) - positions < window.view(-1, 1))
        mask = mask.view(-1, 1, 1, capacity)
        for i, layer in enumerate(self.transformer.layers):
            q, k, v = layer.self_attn.qkv(layer.norm1(x), 0)
            q, k = rope(q, offsets, self.cfg.max_period), rope(k, offsets, self.cfg.max_period)
            kv[rows, i, 0, :, slot] = k[:, :, 0]
            kv[rows, i, 1, :, slot] = v[:, :, 0]
            att = F.scaled_dot_product_attention(q, kv[:, i, 0], kv[:, i, 1], mask)
            x = x + layer.self_attn.out_projs[0](att.transpose(1, 2).reshape(x.shape[0], 1, -1))
            x = layer.ff(x, 0)
        return self.out_norm(x)

    # ------------------------------------------------------------------ depth transformer

    def depth(
        self,
        text: torch.Tensor,
        out: torch.Tensor,
        sampling: list[Sampling],
        force: torch.Tensor | None = None,
        window: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """The frame's dep_q model codes of B sessions, drawn one after another: text [B], out [B, 1, dim].
        ``force`` [B, dep_q] (-1: none) replaces a drawn code as the next code's input (PersonaPlex's prompt);
        the drawn codes are returned. ``window`` [B] narrows a row's attention to that many steps."""
        cfg = self.cfg
        b = out.shape[0]
        heads = cfg.depformer_num_heads
        shape = (b, heads, cfg.dep_q, cfg.depformer_dim // heads)
        cache = [(out.new_zeros(shape), out.new_zeros(shape)) for _ in self.depformer.layers]
        prev, codes = text, []
        for step in range(cfg.dep_q):
            table = self.depformer_text_emb if step == 0 else self.depformer_emb[step - 1]
            x = self.depformer_in[step](out) + self.embed(table, prev)[:, None]
            at = torch.arange(cfg.dep_q, device=out.device).view(1, -1)
            mask = at <= step
            if window is not None:
                mask = mask & (step - at < window.view(-1, 1))
            mask = mask.view(-1, 1, 1, cfg.dep_q)
            for layer, (keys, values) in zip(self.depformer.layers, cache):
                q, k, v = layer.self_attn.qkv(layer.norm1(x), step)
                keys[:, :, step], values[:, :, step] = k[:, :, 0], v[:, :, 0]
                att = F.scaled_dot_product_attention(q, keys, values, mask)
                x = x + layer.self_attn.out_projs[step](att.transpose(1, 2).reshape(b, 1, -1))
                x = layer.ff(x, step)
            logits = self.linears[step](x)[:, 0].float()
            drawn = [draw(logits[i].cpu(), s.temp, s.top_k, s.generator) for i, s in enumerate(sampling)]
            prev = torch.tensor(drawn, device=out.device)
            codes.append(prev)
            if force is not None:
                prev = torch.where(force[:, step] >= 0, force[:, step].to(prev.device), prev)
        return torch.stack(codes, dim=1)


class LMSlots:
    """Per-session state of up to ``capacity`` sessions, in preallocated tensors indexed by slot."""

    def __init__(self, lm: MoshiLM, capacity: int, device: str | torch.device, dtype: torch.dtype):
        cfg = lm.cfg
        self.lm, self.cfg = lm, cfg
        head_dim = cfg.dim // cfg.num_heads
        self.kv = torch.zeros(
            capacity, cfg.num_layers, 2, cfg.num_heads, cfg.context, head_dim, device=device, dtype=dtype
        )
        self.max_delay = max(cfg.delays)
        self.ring = self.max_delay + 2
        self.tokens = torch.full((capacity, 1 + cfg.n_q, self.ring), -2, dtype=torch.long)
        self.offsets = torch.zeros(capacity, dtype=torch.long)
        self.delays = torch.tensor(cfg.delays, dtype=torch.long)
        initial = [cfg.text_card] + [cfg.card] * cfg.n_q
        self.initial = torch.tensor(initial, dtype=torch.long)
        self.free = list(range(capacity - 1, -1, -1))
        # the steps each session attends to, in the temporal and in the depth transformer
        self.windows = torch.full((capacity, 2), 0, dtype=torch.long)

    def take(self, persona: bool = False) -> int:
        """A free slot, reset. ``persona``: the session runs as PersonaPlex's runtime does, whose KV ring
        (moshi 0.1.0's) masks its oldest entry once full, so attention reaches one step less than the ring holds:
        ``context - 1`` steps in the temporal transformer, ``depformer_context - 1`` in the depth transformer."""
        slot = self.free.pop()
        self.kv[slot].zero_()
        self.tokens[slot] = -2
        self.offsets[slot] = 0
        cfg = self.cfg
        short = torch.tensor([cfg.context - 1, (cfg.depformer_context or cfg.dep_q) - 1])
        self.windows[slot] = short if persona else torch.tensor([cfg.context, cfg.dep_q])
        return slot

    def release(self, slot: int) -> None:
        self.free.append(slot)

    @torch.no_grad()
    def step(
        self, slots: list[int], user: torch.Tensor, sampling: list[Sampling], prompts: list[Any] | None = None
    ) -> list[torch.Tensor | None]:
        """One frame of each session in ``slots``: user codes [B, dep_q] -> per session its output frame
        [1 + dep_q] (text token, then the model's codes), or None while the delay pattern fills. ``prompts``
        holds, per session, its ``persona.PromptStep`` when this step is one of its prompt's (else None)."""
        cfg, lm = self.cfg, self.lm
        idx = torch.tensor(slots, dtype=torch.long)
        offsets = self.offsets[idx]
        tokens = self.tokens[idx]
        prompts = prompts or [None] * len(slots)
        for i, p in enumerate(prompts):
            if p is not None and p.restore is not None:
                tokens[i, :, int(offsets[i]) % self.ring] = p.restore
        users = slice(cfg.dep_q + 1, 1 + cfg.n_q)
        writes = (offsets.view(-1, 1) + self.delays[users].view(1, -1)) % self.ring
        tokens[:, users].scatter_(-1, writes[..., None], user[..., None])
        current = tokens.gather(-1, (offsets % self.ring).view(-1, 1, 1).expand(-1, tokens.shape[1], 1))[..., 0]
        is_init = offsets.view(-1, 1) <= self.delays.view(1, -1)
        current = torch.where(is_init, self.initial.view(1, -1), current)
        kv = self.kv[idx]
        device = self.kv.device
        replay, force = self._prompt_inputs(prompts)
        windows = self.windows[idx].to(device)
        short = bool((windows < torch.tensor([cfg.context, cfg.dep_q], device=device)).any())
        out = lm.temporal(current.to(device), kv, offsets.to(device), replay, windows[:, 0] if short else None)
        self.kv[idx] = kv
        text_logits = lm.text_linear(out)[:, 0].float()
        text = torch.tensor(
            [draw(text_logits[i].cpu(), s.temp_text, s.top_k_text, s.generator) for i, s in enumerate(sampling)]
        )
        if force is not None:  # a prompt's tokens replace what was drawn, in the ring and as the depth's inputs
            text = torch.where(force[:, 0] >= 0, force[:, 0], text)
        forced = None if force is None else force[:, 1:]
        audio = lm.depth(text.to(out.device), out, sampling, forced, windows[:, 1] if short else None).cpu()
        if force is not None:
            audio = torch.where(force[:, 1:] >= 0, force[:, 1:], audio)
        offsets = offsets + 1
        at = (offsets % self.ring).view(-1, 1, 1)
        tokens[:, :1].scatter_(-1, at, text.view(-1, 1, 1))
        tokens[:, 1 : cfg.dep_q + 1].scatter_(-1, at.expand(-1, cfg.dep_q, 1), audio[..., None])
        self.tokens[idx], self.offsets[idx] = tokens, offsets
        read = (offsets.view(-1, 1) - self.max_delay + self.delays[: cfg.dep_q + 1].view(1, -1)) % self.ring
        frames = tokens[:, : cfg.dep_q + 1].gather(-1, read[..., None])[..., 0]
        return [frames[i] if int(offsets[i]) > self.max_delay else None for i in range(len(slots))]

    def _prompt_inputs(self, prompts: list[Any]) -> tuple[tuple[torch.Tensor, torch.Tensor] | None, Any]:
        """The rows' replayed input embeddings (rows [B], inputs [B, dim]) and forced tokens [B, 1 + dep_q]."""
        if all(p is None for p in prompts):
            return None, None
        free = torch.full((1 + self.cfg.dep_q,), -1, dtype=torch.long)
        force = torch.stack([free if p is None else p.force for p in prompts])
        rows = [p is not None and p.embed is not None for p in prompts]
        if not any(rows):
            return None, force
        zero = torch.zeros(self.cfg.dim)
        inputs = torch.stack([p.embed if row else zero for p, row in zip(prompts, rows)])
        device = self.kv.device
        return (torch.tensor(rows, device=device), inputs.to(device)), force


def load_lm(path: Any, cfg: LMConfig, device: str, dtype: torch.dtype) -> MoshiLM:
    from safetensors.torch import load_file

    lm = MoshiLM(cfg)
    state = load_file(str(path))
    lm.load_state_dict(split_fused_projections(state, lm), strict=True)
    return lm.to(device=device, dtype=dtype).eval()


def split_fused_projections(state: dict[str, torch.Tensor], lm: MoshiLM) -> dict[str, torch.Tensor]:
    """The released checkpoints keep each attention's per-step projections fused (``in_proj_weight``,
    ``out_proj.weight``: [steps * out, in]); the authors' loader splits them at load, as here."""
    out: dict[str, torch.Tensor] = {}
    for key, value in state.items():
        for fused, split in (
            ("in_proj_weight", "in_projs"),
            ("in_proj.weight", "in_projs"),
            ("out_proj.weight", "out_projs"),
        ):
            if key.endswith("self_attn." + fused):
                prefix = key[: -len(fused)]
                n = len(lm.get_submodule(prefix + split))
                for i, part in enumerate(value.view(n, -1, *value.shape[1:])):
                    out[f"{prefix}{split}.{i}.weight"] = part
                break
        else:
            out[key] = value
    return out

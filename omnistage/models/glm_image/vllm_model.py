"""GLM-Image's AR text decoder as an out-of-tree vLLM model (registered by ``vllm_plugin``).

vLLM 0.32 has no GLM-Image model, and its M-RoPE runner gives every decoded
token the same position on all three axes (``position + delta``), while
GLM-Image gives generated image tokens 2-D grid positions. vLLM has no
documented hook for per-request decode positions, so the request's layout id
rides in the M-RoPE delta (``positions``, which says why and how):

- ``get_mrope_input_positions`` (called once per request with its prompt
  tokens) reads the target grids from the prompt (``<sop>H W<eop>`` ...) and
  returns the prompt's positions and ``DecodeLayouts.delta``;
- ``forward`` replaces the encoded decode positions by the true ones
  (``DecodeLayouts.resolve``).

Image-to-image: source images arrive as VQ ids through vLLM's multimodal
inputs (``vllm_processing``); ``embed_multimodal`` embeds them in place of the
prompt's ``<|image|>`` placeholders, and their grids give the image tokens
2-D positions (the same ``get_rope_index`` rule), after which one target grid
is drawn.
Tensor parallelism is not supported (plain linear layers).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from vllm.config import VllmConfig
from vllm.model_executor.layers.attention import Attention
from vllm.model_executor.models.interfaces import SupportsMRoPE, SupportsMultiModal
from vllm.multimodal import MULTIMODAL_REGISTRY

from omnistage.models.glm_image.positions import DecodeLayouts, prompt_positions
from omnistage.models.glm_image.vllm_processing import (
    GlmImageDummyInputs,
    GlmImageMultiModalProcessor,
    GlmImageProcessingInfo,
)
from omnistage.models.shared.layers import RMSNorm


class _Layer(nn.Module):
    def __init__(self, cfg: Any, vllm_config: VllmConfig, prefix: str):
        super().__init__()
        self.heads, self.kv_heads = cfg.num_attention_heads, cfg.num_key_value_heads
        self.head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
        h, bias = cfg.hidden_size, cfg.attention_bias
        self.self_attn = nn.Module()
        self.self_attn.q_proj = nn.Linear(h, self.heads * self.head_dim, bias=bias)
        self.self_attn.k_proj = nn.Linear(h, self.kv_heads * self.head_dim, bias=bias)
        self.self_attn.v_proj = nn.Linear(h, self.kv_heads * self.head_dim, bias=bias)
        self.self_attn.o_proj = nn.Linear(self.heads * self.head_dim, h, bias=False)
        self.self_attn.attn = Attention(
            self.heads,
            self.head_dim,
            self.head_dim**-0.5,
            num_kv_heads=self.kv_heads,
            cache_config=vllm_config.cache_config,
            prefix=f"{prefix}.self_attn.attn",
        )
        self.mlp = nn.Module()
        self.mlp.gate_up_proj = nn.Linear(h, 2 * cfg.intermediate_size, bias=False)
        self.mlp.down_proj = nn.Linear(cfg.intermediate_size, h, bias=False)
        for name in ("input_layernorm", "post_attention_layernorm", "post_self_attn_layernorm", "post_mlp_layernorm"):
            setattr(self, name, RMSNorm(h, cfg.rms_norm_eps))

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        a = self.self_attn
        y = self.input_layernorm(x)
        n = y.shape[0]
        q = _rope(a.q_proj(y).view(n, self.heads, self.head_dim), cos, sin)
        k = _rope(a.k_proj(y).view(n, self.kv_heads, self.head_dim), cos, sin)
        o = a.attn(q.reshape(n, -1), k.reshape(n, -1), a.v_proj(y))
        x = x + self.post_self_attn_layernorm(a.o_proj(o.reshape(n, -1)))
        gate, up = self.mlp.gate_up_proj(self.post_attention_layernorm(x)).chunk(2, dim=-1)
        return x + self.post_mlp_layernorm(self.mlp.down_proj(up * F.silu(gate)))


def _rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Half-split (neox) rotation of the first ``cos.shape[-1]`` dims, as transformers' GLM-Image."""
    d = cos.shape[-1]
    rot, rest = x[..., :d], x[..., d:]
    x1, x2 = rot[..., : d // 2], rot[..., d // 2 :]
    rotated = torch.cat((-x2, x1), dim=-1)
    cos, sin = cos[:, None, :], sin[:, None, :]
    return torch.cat([rot * cos + rotated * sin, rest], dim=-1)


@MULTIMODAL_REGISTRY.register_processor(
    GlmImageMultiModalProcessor, info=GlmImageProcessingInfo, dummy_inputs=GlmImageDummyInputs
)
class GlmImageARForVLLM(nn.Module, SupportsMRoPE, SupportsMultiModal):
    def __init__(self, *, vllm_config: VllmConfig, prefix: str = ""):
        super().__init__()
        config = vllm_config.model_config.hf_config
        cfg = config.text_config
        self.config = config
        self.vocab_size = cfg.vocab_size
        self.vision_vocab = cfg.vision_vocab_size
        self.model = nn.Module()
        lm = self.model.language_model = nn.Module()
        lm.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        lm.layers = nn.ModuleList(
            _Layer(cfg, vllm_config, f"model.language_model.layers.{i}") for i in range(cfg.num_hidden_layers)
        )
        lm.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.vision_vocab_size, bias=False)

        rope = cfg.rope_parameters
        head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
        dim = int(head_dim * rope.get("partial_rotary_factor", 1.0))
        self.register_buffer(
            "inv_freq", 1.0 / (rope["rope_theta"] ** (torch.arange(0, dim, 2).float() / dim)), persistent=False
        )
        self.mrope_section = list(rope.get("mrope_section", [8, 12, 12]))

        from transformers import AutoTokenizer

        tok = AutoTokenizer.from_pretrained(vllm_config.model_config.tokenizer)
        self._tokenizer = tok
        self._sop = tok.convert_tokens_to_ids(tok.grid_bos_token)
        self._eop = tok.convert_tokens_to_ids(tok.grid_eos_token)
        self._layouts = DecodeLayouts(vllm_config.model_config.max_model_len)

    # ------------------------------------------------------------------ positions

    def _target_grids(self, tokens: list[int], count: int) -> list[tuple[int, int]]:
        """The last ``count`` ``<sop>H W<eop>`` pairs the processor appended (t2i: target, then preview;
        i2i: the target only)."""
        if not tokens or tokens[-1] != self.config.image_start_token_id:
            raise ValueError("GLM-Image prompt must end with the image start token (use GlmImageProcessor)")
        grids, end = [], len(tokens) - 1
        for _ in range(count):
            if end == 0 or tokens[end - 1] != self._eop:
                break
            start = max(i for i in range(end) if tokens[i] == self._sop)
            h, w = self._tokenizer.decode(tokens[start + 1 : end - 1]).split()
            grids.append((int(h), int(w)))
            end = start
        if len(grids) != count:
            raise ValueError(f"GLM-Image prompt lacks its target grid(s) (<sop>H W<eop> x{count})")
        return grids[::-1]

    @staticmethod
    def _source_grids(mm_features: list[Any]) -> list[tuple[int, int, int]]:
        """(offset, h, w) of each source image's placeholder run, in prompt order."""
        out = []
        for f in sorted(mm_features, key=lambda f: f.mm_position.offset):
            _, h, w = (int(v) for v in f.data["image_grid_thw"].data.tolist())
            out.append((f.mm_position.offset, h, w))
        return out

    def get_mrope_input_positions(self, input_tokens: list[int], mm_features: list[Any]) -> tuple[torch.Tensor, int]:
        sources = self._source_grids(mm_features)
        if not sources and self.config.image_end_token_id in input_tokens:
            raise ValueError("GLM-Image on vLLM: source-image tokens need the image as multimodal data")
        prompt_pos, first = prompt_positions(len(input_tokens), sources)
        grids = self._target_grids(list(input_tokens), 1 if sources else 2)
        decode_order = grids[::-1]  # drawn last grid first: preview, then target (get_rope_index)
        return prompt_pos, self._layouts.delta(first, decode_order, len(input_tokens))

    def _cos_sin(self, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        freqs = positions[..., None].float() * self.inv_freq  # [3, n, dim/2]
        parts = [chunk[i % 3] for i, chunk in enumerate(freqs.split(self.mrope_section, dim=-1))]
        f = torch.cat(parts, dim=-1)
        f = torch.cat([f, f], dim=-1)
        return f.cos().to(dtype), f.sin().to(dtype)

    # ------------------------------------------------------------------ vLLM model API

    @classmethod
    def get_placeholder_str(cls, modality: str, i: int) -> str | None:
        return "<|image|>" if modality == "image" else None

    def embed_multimodal(self, **kwargs: Any) -> tuple[torch.Tensor, ...]:
        """Source images' VQ ids -> their token embeddings (one tensor per image)."""
        ids, grids = kwargs.get("image_token_ids"), kwargs.get("image_grid_thw")
        if ids is None:
            return ()
        sizes = [int(g.prod()) for g in grids]
        if isinstance(ids, torch.Tensor):
            ids = ids.flatten().split(sizes)
        return tuple(self.model.language_model.embed_tokens(i.flatten().long()) for i in ids)

    def embed_input_ids(
        self,
        input_ids: torch.Tensor,
        multimodal_embeddings: Any = None,
        *,
        is_multimodal: torch.Tensor | None = None,
        **_: Any,
    ) -> torch.Tensor:
        x = self.model.language_model.embed_tokens(input_ids)
        if multimodal_embeddings is not None and len(multimodal_embeddings) and is_multimodal is not None:
            x = x.clone()
            x[is_multimodal] = torch.cat(list(multimodal_embeddings)).to(x.dtype)
        return x

    def forward(
        self,
        input_ids: torch.Tensor | None,
        positions: torch.Tensor,
        intermediate_tensors: Any = None,
        inputs_embeds: torch.Tensor | None = None,
        **kwargs: Any,
    ) -> torch.Tensor:
        x = inputs_embeds if inputs_embeds is not None else self.embed_input_ids(input_ids)
        if positions.ndim == 1:
            positions = positions.expand(3, -1)
        cos, sin = self._cos_sin(self._layouts.resolve(positions), x.dtype)
        for layer in self.model.language_model.layers:
            x = layer(x, cos, sin)
        return self.model.language_model.norm(x)

    def compute_logits(self, hidden_states: torch.Tensor) -> torch.Tensor:
        logits = self.lm_head(hidden_states)
        # the head covers the vision vocabulary only; text ids are never generated
        pad = logits.new_full((logits.shape[0], self.vocab_size - self.vision_vocab), float("-inf"))
        return torch.cat([logits, pad], dim=-1)

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        params = dict(self.named_parameters())
        loaded = set()
        for name, w in weights:
            if name in params:  # the vision encoder and VQ model are not part of the AR decoder
                with torch.no_grad():
                    params[name].copy_(w)
                loaded.add(name)
        missing = set(params) - loaded
        if missing:
            raise ValueError(f"GLM-Image AR weights missing: {sorted(missing)[:5]}")
        return loaded

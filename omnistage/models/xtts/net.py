"""XTTS v2's modules, named as the release's ``model.pth`` names them (``gpt.*``, ``hifigan_decoder.*``,
``mel_stats``), so the checkpoint loads into ``XttsNet`` as it is and the tiny fixture's ``state_dict`` is a
checkpoint the release loads.

The GPT is transformers' ``GPT2Model`` (the release builds the same) without its token and position
embeddings: inputs are the sum of an embedding table (text or audio codes) and a learned position table of
that stream (positions count from 0 within each stream), after the speaker's 32 conditioning latents.
"""

from __future__ import annotations

import torch
from torch import nn

from omnistage.models.xtts.conditioning import ConditioningEncoder, PerceiverResampler
from omnistage.models.xtts.config import XttsArgs
from omnistage.models.xtts.hifigan import HifiganGenerator
from omnistage.models.xtts.speaker import SpeakerEncoder

COND_MELS = 80


class LearnedPositions(nn.Module):
    def __init__(self, n: int, dim: int):
        super().__init__()
        self.emb = nn.Embedding(n, dim)


class NoPositions(nn.Module):
    """GPT2Model's own position table, switched off (each stream adds its own)."""

    def forward(self, position_ids: torch.Tensor) -> torch.Tensor:
        return torch.zeros((), device=position_ids.device)


def gpt2(args: XttsArgs) -> nn.Module:
    from transformers import GPT2Config, GPT2Model

    # the release's GPT2Config (n_positions is unused: the position tables are the streams' own)
    mel_len, text_len = args.max_audio_tokens + 3, args.max_text_tokens + 2
    n = mel_len + text_len + args.max_prompt_tokens
    config = GPT2Config(vocab_size=256, n_positions=n, n_ctx=n, n_embd=args.dim, n_layer=args.layers, n_head=args.heads)
    config._attn_implementation = "sdpa"  # the AR engine passes boolean 4-D masks (padded per-request caches)
    model = GPT2Model(config)
    del model.wte
    model.wpe = NoPositions()
    return model


class GptNet(nn.Module):
    def __init__(self, args: XttsArgs, text_tokens: int):
        super().__init__()
        self.conditioning_encoder = ConditioningEncoder(COND_MELS, args.dim, args.heads)
        self.conditioning_perceiver = PerceiverResampler(args.dim)
        self.text_embedding = nn.Embedding(text_tokens, args.dim)
        self.mel_embedding = nn.Embedding(args.num_audio_tokens, args.dim)
        self.gpt = gpt2(args)
        self.mel_pos_embedding = LearnedPositions(args.max_audio_tokens + 3, args.dim)
        self.text_pos_embedding = LearnedPositions(args.max_text_tokens + 2, args.dim)
        self.final_norm = nn.LayerNorm(args.dim)
        self.text_head = nn.Linear(args.dim, text_tokens)
        self.mel_head = nn.Linear(args.dim, args.num_audio_tokens)


class HifiDecoder(nn.Module):
    def __init__(self, args: XttsArgs):
        super().__init__()
        self.waveform_decoder = HifiganGenerator(args.dim, args.d_vector_dim)
        self.speaker_encoder = SpeakerEncoder()


class XttsNet(nn.Module):
    def __init__(self, args: XttsArgs, text_tokens: int):
        super().__init__()
        self.gpt = GptNet(args, text_tokens)
        self.hifigan_decoder = HifiDecoder(args)
        self.register_buffer("mel_stats", torch.ones(COND_MELS))


# keys of a trainer's checkpoint that inference does not use (the release drops them as it loads)
_UNUSED = ("torch_mel_spectrogram_style_encoder", "torch_mel_spectrogram_dvae", "dvae")


def load_state(path: str, net: XttsNet) -> None:
    """``model.pth`` (the release's ``{"model": state_dict}``) into ``net``; every module key must be there."""
    state = torch.load(path, map_location="cpu", weights_only=True)["model"]
    state = {k.removeprefix("xtts."): v for k, v in state.items()}
    state = {k: v for k, v in state.items() if k.split(".")[0] not in _UNUSED and ".gpt_inference." not in k}
    missing, unexpected = net.load_state_dict(state, strict=False)
    if missing or unexpected:
        raise ValueError(f"model.pth does not fit XTTS v2: missing {missing[:5]}, unexpected {unexpected[:5]}")

"""A span of a DAC decoder's output (transformers ``DacDecoder``), computing only what that span depends on.

A streamed block of a non-causal codec is decoded with its receptive field on both sides, but only the block's
own samples are kept: decoding the whole window spends most of its time on the last layers (audio rate) for
samples that are thrown away. The decoder is a chain of length-preserving convolutions (padding
``dilation * (kernel - 1) / 2``), transposed convolutions (output ``stride`` times the input) and point-wise
activations, so the inputs each layer's output span needs are known exactly: walking back from the kept span
gives every layer's needed span, and the forward keeps only that span after each layer. A kept sample's inputs
are all there (a span cut at the sequence's edge is padded with zeros as the whole decode pads it), so the span
equals the whole decode's samples up to float rounding.
"""

from __future__ import annotations

import torch
from torch import nn

_POINT, _CONV, _UP = "point", "conv", "up"


def _half_width(conv: nn.Conv1d) -> int:
    """How far on either side a stride-1, length-preserving convolution reaches."""
    reach = conv.dilation[0] * (conv.kernel_size[0] - 1)
    if conv.stride[0] != 1 or reach % 2 or conv.padding[0] != reach // 2:
        raise ValueError(f"not a length-preserving convolution: {conv}")
    return reach // 2


def _layers(decoder: nn.Module) -> list[tuple[str, nn.Module, int]]:
    """The decoder's layers in order: (kind, module, reach) — reach: the half width of a convolution."""
    out: list[tuple[str, nn.Module, int]] = [(_CONV, decoder.conv1, _half_width(decoder.conv1))]
    for block in decoder.block:
        out += [(_POINT, block.snake1, 0), (_UP, block.conv_t1, 0)]
        # a residual unit: snake, dilated kernel-7 convolution, snake, kernel-1 convolution, plus its input
        out += [(_CONV, u, _half_width(u.conv1)) for u in (block.res_unit1, block.res_unit2, block.res_unit3)]
    return [
        *out,
        (_POINT, decoder.snake1, 0),
        (_CONV, decoder.conv2, _half_width(decoder.conv2)),
        (_POINT, decoder.tanh, 0),
    ]


def _spans(layers: list[tuple[str, nn.Module, int]], frames: int, start: int, end: int) -> list[tuple[int, int]]:
    """The span [a, b) of every layer's input (then the output's) that output samples [start, end) of a
    ``frames``-frame sequence depend on."""
    lengths = [frames]
    for kind, m, _ in layers:
        lengths.append(lengths[-1] * m.stride[0] if kind == _UP else lengths[-1])
    need: list[tuple[int, int]] = [(0, 0)] * len(lengths)
    need[-1] = (max(start, 0), min(end, lengths[-1]))
    for j in reversed(range(len(layers))):
        kind, m, reach = layers[j]
        a, b = need[j + 1]
        if kind == _UP:  # output n = i * stride - padding + k (0 <= k < kernel): the inputs i that reach [a, b)
            s, k, p = m.stride[0], m.kernel_size[0], m.padding[0]
            a, b = (a + p - k) // s + 1, (b - 1 + p) // s + 1
        a, b = a - reach, b + reach
        need[j] = (max(a, 0), min(b, lengths[j]))
    return need


def receptive_frames(decoder: nn.Module) -> int:
    """Frames on either side of a frame whose codes can change its samples (exact: the same walk as
    ``decode_span``)."""
    layers = _layers(decoder)
    hop = 1
    for kind, m, _ in layers:
        hop *= m.stride[0] if kind == _UP else 1
    middle = 10_000  # a frame far from both ends of the sequence
    a, b = _spans(layers, 2 * middle, middle * hop, (middle + 1) * hop)[0]
    return max(middle - a, b - (middle + 1))


def decode_span(decoder: nn.Module, latent: torch.Tensor, start: int, end: int) -> torch.Tensor:
    """``decoder(latent)[..., start:end]`` for latent [B, C, T], computing only the samples it depends on.
    The transposed convolutions must make exactly ``stride`` outputs per input (the release's DAC)."""
    layers = _layers(decoder)
    need = _spans(layers, latent.shape[-1], start, end)
    a, b = need[0]
    hidden, offset = latent[..., a:b], a  # offset: the position of hidden[..., 0] in the whole sequence
    for (kind, m, _), (a, b) in zip(layers, need[1:]):
        hidden = m(hidden)
        if kind == _UP:
            offset *= m.stride[0]
        hidden, offset = hidden[..., a - offset : b - offset], a
    return hidden

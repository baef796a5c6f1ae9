"""Prompt embeddings of different token counts in one forward: for denoisers that take each row's text length and
mask the padding themselves (Z-Image's caption lists, ERNIE-Image's ``text_lens``)."""

from __future__ import annotations

import torch


def pad_texts(feats: list[torch.Tensor]) -> tuple[torch.Tensor, list[int]]:
    """Per-job ``[rows, tokens_i, D]`` embeddings -> one zero-padded ``[sum of rows, longest, D]`` tensor and each
    row's own token count (a host list: the caller makes it a tensor where its model wants one)."""
    longest = max(f.shape[1] for f in feats)
    padded = feats[0].new_zeros(sum(f.shape[0] for f in feats), longest, feats[0].shape[2])
    lengths: list[int] = []
    pos = 0
    for f in feats:
        padded[pos : pos + f.shape[0], : f.shape[1]] = f
        lengths += [f.shape[1]] * f.shape[0]
        pos += f.shape[0]
    return padded, lengths

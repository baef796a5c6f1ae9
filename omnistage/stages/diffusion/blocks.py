"""A denoiser's transformer blocks as a family declares them (``DiffusionAdapter.block_layouts``).

Step caching and regional ``torch.compile`` (acceleration.py, step_cache.py) work on the blocks of a
DiT while diffusers' own ``forward`` runs unchanged around them: the embeddings before the blocks and
the output head after them are never copied here. What they need to know per block kind:

- ``returns``: the names of the block's return values in order (a plain string: the block returns
  that one tensor, not a tuple). These are the tensors passed on from block to block.
- ``per_row``: the other arguments with one row per batch row (``temb``, masks, per-row caches), which
  must be cut to the rows a block runs on. Arguments not named (rotary tables) are shared by all rows.
- ``slicers``: how to take rows of a per-row argument that is not a tensor (GLM-Image's layer KV cache).
- ``hidden``: which of ``returns`` is the image-token stream (``hidden_states`` unless named otherwise).
- ``joins``: for a block whose ``hidden`` input is streams of the blocks before it joined along the token axis
  (FLUX.2's single-stream blocks take ``cat([text, image])``): those streams' names, the image stream last, so
  its image tokens are the trailing ones.

A family adds step caching in a few lines, e.g. SD3::

    def block_layouts(self):
        tr = self.pipe.transformer
        return [BlockLayout.uniform(tr, tr.transformer_blocks, JOINT_BLOCK, probe=adaln_zero_probe)]
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

RowSlicer = Callable[[Any, torch.Tensor], Any]


@dataclass(frozen=True)
class BlockIO:
    returns: str | tuple[str, ...]
    per_row: tuple[str, ...] = ()
    slicers: Mapping[str, RowSlicer] = field(default_factory=dict)
    hidden: str = "hidden_states"  # the image-token stream among ``returns`` (first-block cache's probe)
    joins: tuple[str, ...] = ()  # ``hidden`` is these earlier streams joined along tokens (image stream last)

    @property
    def names(self) -> tuple[str, ...]:
        return (self.returns,) if isinstance(self.returns, str) else self.returns

    def unpack(self, output: Any) -> dict[str, Any]:
        if isinstance(self.returns, str):
            return {self.returns: output}
        return dict(zip(self.returns, output))

    def pack(self, values: Mapping[str, Any]) -> Any:
        if isinstance(self.returns, str):
            return values[self.returns]
        return tuple(values[n] for n in self.returns)

    def anchor(self, anchors: Mapping[str, torch.Tensor | None], name: str) -> torch.Tensor | None:
        """Output ``name``'s value where the cached blocks began (``anchors`` holds the first block's streams)."""
        if name != self.hidden or not self.joins:
            return anchors.get(name)
        return torch.cat([anchors[n] for n in self.joins], dim=1)

    def image_tokens(self, x: torch.Tensor, anchors: Mapping[str, Any]) -> torch.Tensor:
        """The image tokens of this block's ``hidden`` stream (all of it unless it ``joins`` streams)."""
        return x[:, -anchors[self.joins[-1]].shape[1] :] if self.joins else x

    def add_image_residual(self, anchor: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
        """``anchor`` with the image tokens' ``residual`` added (a joined stream's leading text tokens kept)."""
        if not self.joins:
            return anchor + residual
        n = residual.shape[1]
        return torch.cat([anchor[:, :-n], anchor[:, -n:] + residual], dim=1)

    def take_rows(self, name: str, value: Any, idx: torch.Tensor) -> Any:
        if value is None:
            return None
        if name in self.slicers:
            return self.slicers[name](value, idx)
        if not isinstance(value, torch.Tensor):
            raise TypeError(f"per-row block argument {name!r} is a {type(value).__name__}; declare a slicer for it")
        return value.index_select(0, idx)


# SD3 / SD3.5 JointTransformerBlock (and Flux's double-stream block): (encoder_hidden_states, hidden_states)
JOINT_BLOCK = BlockIO(returns=("encoder_hidden_states", "hidden_states"), per_row=("temb",))


def adaln_zero_probe(block: nn.Module, args: Mapping[str, Any]) -> torch.Tensor:
    """TeaCache's probe for blocks with an AdaLayerNormZero ``norm1(hidden_states, emb=temb)``: the
    timestep-modulated input of the first block."""
    return block.norm1(args["hidden_states"], emb=args["temb"])[0]


@dataclass(frozen=True)
class BlockLayout:
    """One denoiser model and its transformer blocks in the order its forward calls them."""

    model: nn.Module
    blocks: tuple[tuple[nn.Module, BlockIO], ...]
    # TeaCache: the probe compared between steps, from the first block and its bound arguments
    probe: Callable[[nn.Module, Mapping[str, Any]], torch.Tensor] | None = None

    @classmethod
    def uniform(
        cls,
        model: nn.Module,
        blocks: Iterable[nn.Module],
        io: BlockIO,
        probe: Callable[[nn.Module, Mapping[str, Any]], torch.Tensor] | None = None,
    ) -> BlockLayout:
        return cls(model, tuple((b, io) for b in blocks), probe)

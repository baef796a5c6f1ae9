"""GLM-Image's M-RoPE positions on vLLM, and the one workaround they need (no vLLM import).

transformers' GLM-Image (``GlmImageModel.get_rope_index``) places prompt text
one position per token, source-image tokens on a 2-D grid, and every
*generated* image token on the 2-D grid of the image it is drawing.

vLLM 0.32 has no documented way to give generated tokens per-request positions:
``SupportsMRoPE.get_mrope_input_positions`` is called once per request and
returns the prompt's positions plus one integer delta, and the model runner
(GPU and CPU alike, ``MRotaryEmbedding.get_next_input_positions_tensor``)
places generated token ``k`` at ``delta + len(prompt) + k`` on all three axes.
No other hook reaches decode positions: ``SupportsMultiModalPruning.
recompute_mrope_positions`` runs at prefill only, there is no XD-RoPE hook, and
``forward`` sees neither request ids nor request state.

So the delta carries a *layout id*: ``delta = encode(id, 0) - len(prompt)``,
generated token ``k`` then arrives as ``encode(id, k)``, and ``DecodeLayouts``
maps it back to ``table[id][:, k]``. A layout is (first decode position, grids
in drawing order): requests with the same layout share an id and a table.
Positions must stay below 2**31 (vLLM's GPU model runner v2 keeps deltas in
int32), so ids are few (2047) and recycled least recently used first;
``resolve`` touches every id it reads, so a running request keeps its id while
fewer than 2047 other layouts are registered between two of its steps.
"""

from __future__ import annotations

from collections import OrderedDict

import torch

SHIFT = 20  # encoded positions carry the layout id above this bit (contexts < 2**20 tokens)
MAX_STEPS = 1 << SHIFT
MAX_IDS = (1 << (31 - SHIFT)) - 1  # ids 1..2047: every encoded position stays below 2**31

Grid = tuple[int, int]


def encode(layout_id: int, step: int) -> int:
    """The position vLLM gives decode step ``step`` of a request whose delta came from ``layout_id``."""
    if not 1 <= layout_id <= MAX_IDS:
        raise ValueError(f"layout_id: {layout_id} is outside 1..{MAX_IDS}")
    if not 0 <= step < MAX_STEPS:
        raise ValueError(f"step: {step} is outside 0..{MAX_STEPS - 1}")
    return (layout_id << SHIFT) | step


def decode(position: int) -> tuple[int, int]:
    """``encode``'s inverse: (layout id, step)."""
    return position >> SHIFT, position & (MAX_STEPS - 1)


def is_encoded(positions: torch.Tensor) -> torch.Tensor:
    """Which positions are encoded decode steps (prompt positions stay below 2**SHIFT)."""
    return positions >= MAX_STEPS


def grid_positions(start: int, grids: list[Grid]) -> torch.Tensor:
    """[3, n] positions of the grids' tokens in drawing order, then one for the end token.

    Each token sits at (start, start + row, start + col); the next grid starts max(h, w)
    later (``get_rope_index``'s rule for the grids it draws).
    """
    cols = []
    pos = start
    for h, w in grids:
        rows = torch.arange(h).repeat_interleave(w)
        colw = torch.arange(w).repeat(h)
        cols.append(torch.stack([torch.full((h * w,), pos), pos + rows, pos + colw]))
        pos += max(h, w)
    cols.append(torch.full((3, 1), pos))
    return torch.cat(cols, dim=1)


def prompt_positions(num_tokens: int, sources: list[tuple[int, int, int]]) -> tuple[torch.Tensor, int]:
    """([3, num_tokens] prompt positions, the first decode position).

    ``sources``: (offset, h, w) of each source image's ``h * w`` token run, in prompt order.
    Text counts up one by one; an image's tokens sit on a 2-D grid anchored at the running
    position, which then advances by max(h, w) (``get_rope_index``).
    """
    parts, pos, done = [], 0, 0
    for offset, h, w in sources:
        parts.append(torch.arange(pos, pos + offset - done).expand(3, -1))
        pos += offset - done
        parts.append(grid_positions(pos, [(h, w)])[:, :-1])
        pos += max(h, w)
        done = offset + h * w
    parts.append(torch.arange(pos, pos + num_tokens - done).expand(3, -1))
    pos += num_tokens - done
    return torch.cat(parts, dim=1), pos


class DecodeLayouts:
    """The layout id table: register a request's decode layout, resolve encoded positions."""

    def __init__(self, max_model_len: int, max_ids: int = MAX_IDS):
        if max_model_len >= MAX_STEPS:
            raise ValueError(f"max_model_len: GLM-Image on vLLM supports contexts below {MAX_STEPS} tokens")
        if not 1 <= max_ids <= MAX_IDS:
            raise ValueError(f"max_ids: {max_ids} is outside 1..{MAX_IDS}")
        self.max_ids = max_ids
        self._ids: OrderedDict[tuple, int] = OrderedDict()  # layout -> id, least recently used first
        self._layouts: dict[int, tuple] = {}  # id -> layout
        self._tables: dict[int, torch.Tensor] = {}  # id -> [3, n] decode positions

    def __len__(self) -> int:
        return len(self._ids)

    def delta(self, first: int, grids: list[Grid], prompt_len: int) -> int:
        """The M-RoPE delta for a request whose decode positions start at ``first`` and draw ``grids``."""
        layout = (first, tuple(grids))
        layout_id = self._ids.get(layout)
        if layout_id is not None:
            self._ids.move_to_end(layout)
        else:
            if len(self._ids) < self.max_ids:
                layout_id = len(self._ids) + 1
            else:  # recycle the least recently used id
                _, layout_id = self._ids.popitem(last=False)
                del self._layouts[layout_id]
            self._ids[layout] = layout_id
            self._layouts[layout_id] = layout
            self._tables[layout_id] = grid_positions(first, list(grids))
        return encode(layout_id, 0) - prompt_len

    def resolve(self, positions: torch.Tensor) -> torch.Tensor:
        """[3, n] positions from vLLM -> the true ones: encoded columns become their table's column
        (past the table's end: its last column); prompt positions are returned as they are."""
        encoded = is_encoded(positions[0])
        if not bool(encoded.any()):
            return positions
        cols = encoded.nonzero().flatten()
        ids = (positions[0, cols] >> SHIFT).tolist()
        steps = positions[0, cols] & (MAX_STEPS - 1)
        out = positions.clone()
        # touch ids in the order of their last column (in use: not recycled next)
        for layout_id in reversed(dict.fromkeys(reversed(ids))):
            layout = self._layouts.get(layout_id)
            if layout is None:
                raise RuntimeError(f"GLM-Image decode position names layout id {layout_id}, which is not registered")
            self._ids.move_to_end(layout)
            table = self._tables[layout_id]
            mine = torch.tensor([i == layout_id for i in ids])
            out[:, cols[mine]] = table[:, steps[mine].clamp(max=table.shape[1] - 1)].to(out.dtype)
        return out

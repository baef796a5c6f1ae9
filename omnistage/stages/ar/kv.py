"""Per-request key/value caches of a step-batched autoregressive model, attended as one padded batch per step.

Requests join and leave at step boundaries and sit at different lengths,
so each keeps its own keys/values (``RequestKV``: one growing buffer per layer).
For one forward over several requests, ``StepCache`` is what the transformers
attention layers call (``update``, as on any transformers cache): it appends each
row's new keys/values to that request's store and returns every row's cache
right-padded to a common length; ``mask()`` is the boolean 4-D attention mask
that hides the padding and keeps attention causal, so each row computes what it
would alone. Rows may add different numbers of tokens (several prefills in one
forward): the inputs are right-padded to the longest, and a row's padding
positions are neither stored nor attended by its real tokens.
"""

from __future__ import annotations

import torch


class RequestKV:
    def __init__(self, num_layers: int):
        self.keys: list[torch.Tensor | None] = [None] * num_layers
        self.values: list[torch.Tensor | None] = [None] * num_layers
        self.length = 0  # tokens cached (the same in every layer once a forward completed)

    def write(self, layer: int, start: int, k: torch.Tensor, v: torch.Tensor) -> None:
        """Store ``k``/``v`` [heads, T, dim] at positions ``start..start+T`` (buffers double as needed)."""
        end = start + k.shape[1]
        buf = self.keys[layer]
        if buf is None or buf.shape[1] < end:
            cap = max(end, 2 * (buf.shape[1] if buf is not None else 16))
            new_k = k.new_empty(k.shape[0], cap, k.shape[2])
            new_v = v.new_empty(v.shape[0], cap, v.shape[2])
            if buf is not None:
                new_k[:, :start] = buf[:, :start]
                new_v[:, :start] = self.values[layer][:, :start]
            self.keys[layer], self.values[layer] = new_k, new_v
        self.keys[layer][:, start:end] = k
        self.values[layer][:, start:end] = v


class StepCache:
    """The cache of one forward over ``rows``, each adding ``new_tokens`` tokens (one count for every row, or one
    per row: the forward's inputs are then right-padded to the largest)."""

    def __init__(self, rows: list[RequestKV], new_tokens: int | list[int]):
        self.rows = rows
        self.counts = [new_tokens] * len(rows) if isinstance(new_tokens, int) else list(new_tokens)
        self.new_tokens = max(self.counts)  # the forward's query length
        self.starts = [r.length for r in rows]
        self.kv_len = max(s + n for s, n in zip(self.starts, self.counts))

    def update(
        self, key_states: torch.Tensor, value_states: torch.Tensor, layer_idx: int, cache_kwargs: dict | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        b, h, t, d = key_states.shape
        keys = key_states.new_zeros(b, h, self.kv_len, d)
        values = value_states.new_zeros(b, h, self.kv_len, d)
        for i, (row, start, n) in enumerate(zip(self.rows, self.starts, self.counts)):
            row.write(layer_idx, start, key_states[i, :, :n], value_states[i, :, :n])
            keys[i, :, : start + n] = row.keys[layer_idx][:, : start + n]
            values[i, :, : start + n] = row.values[layer_idx][:, : start + n]
        return keys, values

    def mask(self, device: torch.device | str) -> torch.Tensor:
        """[B, 1, T, kv_len], True where query t of row i may attend: keys up to its own position (a padding
        query, t >= the row's count, sees the row's real keys only)."""
        t = torch.arange(self.new_tokens, device=device).view(1, -1, 1)
        j = torch.arange(self.kv_len, device=device).view(1, 1, -1)
        starts = torch.tensor(self.starts, device=device).view(-1, 1, 1)
        last = starts + torch.tensor(self.counts, device=device).view(-1, 1, 1) - 1
        return (j <= torch.minimum(starts + t, last)).unsqueeze(1)

    def commit(self) -> None:
        for row, start, n in zip(self.rows, self.starts, self.counts):
            row.length = start + n

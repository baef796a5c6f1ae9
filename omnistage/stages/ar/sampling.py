"""Per-request token sampling as transformers' ``generate`` does it, one row at a time.

Each request draws from its own ``torch.Generator``: a seeded request draws the same
numbers alone or in any batch, and the same ones transformers draws from the global
generator after ``torch.manual_seed(seed)`` when it runs that request alone (the
warpers below are transformers' temperature, top-k and top-p, in that order).
"""

from __future__ import annotations

import torch

from omnistage.errors import InvalidRequestError


def request_generator(temperature: float, seed: object) -> torch.Generator | None:
    """The generator of one request (None when greedy); ``seed`` None draws a fresh random seed."""
    if temperature == 0:
        return None
    generator = torch.Generator()
    if seed is None:
        generator.seed()
        return generator
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        raise InvalidRequestError("seed", f"expected a non-negative integer, got {seed!r}")
    generator.manual_seed(seed)
    return generator


def draw(
    scores: torch.Tensor, temperature: float, top_k: int | None, top_p: float | None, generator: torch.Generator | None
) -> int:
    """One token from float32 ``scores`` [V] (already penalised): greedy when ``temperature`` is 0."""
    if temperature == 0:
        return int(torch.argmax(scores))
    scores = scores / temperature
    if top_k is not None and 0 < top_k < scores.numel():
        kth = torch.topk(scores, top_k).values[-1]
        scores = scores.masked_fill(scores < kth, float("-inf"))
    if top_p is not None and top_p < 1.0:
        ordered, order = torch.sort(scores, descending=False)
        cum = ordered.softmax(-1).cumsum(-1)
        drop = cum <= (1 - top_p)
        drop[-1] = False
        scores = scores.masked_fill(drop.scatter(0, order, drop), float("-inf"))
    probs = scores.softmax(-1)
    return int(torch.multinomial(probs, 1, generator=generator))

"""The codec stage's generation adapter: batched, streamed codec decoding.

Each call gets one new piece of codes per request ([K, n] frames); the first
piece may carry ``context`` (a cloned voice's reference codes: decoded in front
of the speech, never emitted, as the Llasa recipe decodes prompt + generated
codes together). Per request, ``item.state`` keeps the codes still needed.

What is emitted when:

- a whole (non-streamed) sequence is decoded in one call, context included:
  exactly the codec's decode of everything, minus the context's samples;
- a causal codec (Mimi) emits every frame as it arrives, decoded with the last
  ``context`` frames in front (its receptive field by default: exact);
- a non-causal codec (XCodec2) emits fixed blocks — the first
  ``initial_codec_chunk_frames``, then every ``chunk_frames`` — each decoded
  with ``context`` frames before it and ``lookahead`` frames after it (a block
  waits for its lookahead). The blocks depend only on the codes and these
  numbers, never on how the pieces arrived or were batched, so a request's
  streamed audio is the same alone or under load up to float32 rounding (the
  decode's kernels round differently with the batch size: 2.9e-7, one PCM16
  level at most); it differs from the whole decode (docs/families/codec_tts.md has
  the measured difference).

Windows of a causal codec are right-padded into one batch (padding never
reaches real samples); a non-causal codec's windows are batched per length.
"""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path
from typing import Any

import torch

from omnistage.errors import InvalidRequestError
from omnistage.models.shared.codec_lm.codec import load_codec
from omnistage.models.shared.codec_lm.config import NON_CAUSAL_CONTEXT, TTSConfig, load_tts_config
from omnistage.pipeline import StageContext
from omnistage.stages.generation.engine import GenerationItem

PARAM_KEYS = {"chunk_frames", "initial_codec_chunk_frames", "seed"}  # "seed": routed generic knob; unused


def stage_params(item: GenerationItem, keys: set[str], field: str, stage: str) -> dict[str, Any]:
    """A decoder stage's params of ``item`` (empty when it has none); a key ``stage`` does not take is a 400
    naming ``field`` (where the caller set them)."""
    params = item.params if isinstance(item.params, dict) else {}
    unknown = sorted(set(params) - keys)
    if unknown:
        raise InvalidRequestError(
            field, f"unknown field(s) {', '.join(unknown)} for {stage} (it takes {', '.join(sorted(keys))})"
        )
    return params


def positive_int(params: dict[str, Any], key: str) -> int | None:
    n = params.get(key)
    if n is not None and (isinstance(n, bool) or not isinstance(n, int) or n < 1):
        raise InvalidRequestError(key, f"expected a positive integer, got {n!r}")
    return n


class CodecDecoderAdapter:
    def __init__(self, ctx: StageContext):
        if ctx.model is None:
            raise ValueError("codec_tts needs a model folder (omnistage.json + lm/ + codec/)")
        folder = Path(ctx.model)
        self.config = load_tts_config(folder)
        device = f"cuda:{ctx.devices[0]}" if ctx.devices and torch.cuda.is_available() else "cpu"
        self.codec = load_codec(folder / "codec", device)
        if (
            self.codec.num_quantizers != self.config.num_quantizers
            or self.codec.codebook_size != self.config.codebook_size
        ):
            raise ValueError(
                f"{folder / 'omnistage.json'}: num_quantizers/codebook_size ({self.config.num_quantizers}, "
                f"{self.config.codebook_size}) do not match the codec ({self.codec.num_quantizers}, {self.codec.codebook_size})"
            )
        left, ahead = (self.codec.receptive_frames, 0) if self.codec.causal else NON_CAUSAL_CONTEXT
        cfg = self.config
        self.context = left if cfg.decode_context_frames is None else cfg.decode_context_frames
        self.lookahead = ahead if cfg.decode_lookahead_frames is None else cfg.decode_lookahead_frames
        self.calls: list[int] = []  # rows of each decode call (tests look at it)

    def serve_own_codec(self, codec: Any, chunk_frames: int, initial_chunk_frames: int) -> None:
        """Set up over a family's own codec instead of a codec_tts folder's (a subclass's ``__init__`` calls it
        in place of ``super().__init__``): the codec's sizes, the family's chunk sizes. The subclass then sets
        ``context`` and ``lookahead``."""
        self.codec = codec
        self.config = TTSConfig(
            codebook_size=codec.codebook_size,
            num_quantizers=codec.num_quantizers,
            chunk_frames=chunk_frames,
            initial_chunk_frames=initial_chunk_frames,
        )
        self.calls = []

    # ------------------------------------------------------------------ inputs

    def check(self, item: GenerationItem) -> tuple[torch.Tensor, torch.Tensor | None, int, int]:
        """(new codes [K, n], context codes or None, chunk frames, first chunk frames)."""
        params = stage_params(item, PARAM_KEYS, "sampling_params", "the codec stage")
        chunk = positive_int(params, "chunk_frames") or self.config.chunk_frames
        first = positive_int(params, "initial_codec_chunk_frames") or self.config.initial_chunk_frames or chunk
        codes = self._codes(item.inputs.get("codes"), "codes")
        context = item.inputs.get("context")
        return codes, None if context is None else self._codes(context, "context"), chunk, first

    def _codes(self, codes: Any, field: str) -> torch.Tensor:
        k = self.codec.num_quantizers
        if codes is None:
            return torch.empty(k, 0, dtype=torch.long)
        codes = torch.as_tensor(codes)
        if codes.dim() != 2 or codes.shape[0] != k or codes.dtype not in (torch.int64, torch.int32):
            raise InvalidRequestError(
                field, f"expected an integer tensor [{k}, frames], got {tuple(codes.shape)} {codes.dtype}"
            )
        if codes.numel() and (codes.min() < 0 or codes.max() >= self.codec.codebook_size):
            raise InvalidRequestError(field, f"values must be in 0..{self.codec.codebook_size - 1}")
        return codes.long()

    # ------------------------------------------------------------------ schedule

    def blocks(self, state: dict[str, Any], last: bool, streamed: bool, chunk: int) -> list[tuple[int, int, int, int]]:
        """The blocks ready to decode, as absolute frame indices (lo, start, end, hi): decode [lo, hi),
        emit [start, end). Frame 0 is the first context frame; state["base"] is the index of the first
        frame still held in state["codes"]."""
        total = state["base"] + state["codes"].shape[1]
        out: list[tuple[int, int, int, int]] = []
        if not streamed:
            if last and total > state["emitted"]:
                out.append((state["base"], state["emitted"], total, total))
                state["emitted"] = total
            return out
        while state["emitted"] < total:
            start = state["emitted"]
            if self.codec.causal:
                end = total if last else total - self.lookahead
            else:
                end = min(state["boundary"], total)
                if not last and (end < state["boundary"] or end + self.lookahead > total):
                    break  # the block or its lookahead is not complete yet
            if end <= start:
                break
            out.append((max(state["base"], start - self.context), start, end, min(total, end + self.lookahead)))
            state["emitted"] = end
            state["boundary"] = end + chunk
        return out

    # ------------------------------------------------------------------ decoding

    def run(self, items: list[GenerationItem]) -> list[Any]:
        results: list[Any] = [None] * len(items)
        windows: list[tuple[int, torch.Tensor, int, int]] = []  # (item, codes [K, w], keep from, keep to)
        for i, item in enumerate(items):
            try:
                codes, context, chunk, first = self.check(item)
            except ValueError as e:
                results[i] = e
                continue
            state = item.state
            if "codes" not in state:
                ctx = context if context is not None else codes[:, :0]
                n = ctx.shape[1]
                state.update(
                    codes=ctx,
                    base=0,
                    emitted=n,
                    boundary=n + first,
                    # one piece that is also the last and not marked streamed: the whole sequence
                    streamed=bool(item.inputs.get("streamed", not item.last)),
                )
            state["codes"] = torch.cat([state["codes"], codes], dim=1)
            results[i] = {}
            for lo, start, end, hi in self.blocks(state, item.last, state["streamed"], chunk):
                base = state["base"]
                windows.append((i, state["codes"][:, lo - base : hi - base], start - lo, end - lo))
            keep = max(state["base"], state["emitted"] - self.context)  # what later blocks can still need
            state["codes"] = state["codes"][:, keep - state["base"] :]
            state["base"] = keep
        pieces: dict[int, list[torch.Tensor]] = defaultdict(list)
        for i, audio in self._decode(windows):
            pieces[i].append(audio)
        for i, parts in pieces.items():
            results[i] = {"audio": torch.cat(parts), "sample_rate": self.codec.sample_rate}
        return results

    def _decode(self, windows: list[tuple[int, torch.Tensor, int, int]]) -> list[tuple[int, torch.Tensor]]:
        """Each window's kept samples, in window order; one decode call per batch."""
        if not windows:
            return []
        # a codec that decodes a span of a window computes only the kept samples: windows batch per span
        spans = not self.codec.causal and hasattr(self.codec, "decode_span")
        if self.codec.causal:
            groups = [list(range(len(windows)))]  # right padding is harmless: one batch
        else:
            by_len: dict[tuple[int, ...], list[int]] = defaultdict(list)
            for j, (_, w, keep_from, keep_to) in enumerate(windows):
                by_len[(w.shape[1], keep_from, keep_to) if spans else (w.shape[1],)].append(j)
            groups = list(by_len.values())
        spf = self.codec.samples_per_frame
        out: dict[int, tuple[int, torch.Tensor]] = {}
        for group in groups:
            longest = max(windows[j][1].shape[1] for j in group)
            batch = torch.zeros(len(group), self.codec.num_quantizers, longest, dtype=torch.long)
            for row, j in enumerate(group):
                batch[row, :, : windows[j][1].shape[1]] = windows[j][1]
            if spans:
                _, _, keep_from, keep_to = windows[group[0]]
                audio = self.codec.decode_span(batch, keep_from * spf, keep_to * spf)
            else:
                audio = self.codec.decode(batch)
            self.calls.append(len(group))
            for row, j in enumerate(group):
                i, _, keep_from, keep_to = windows[j]
                out[j] = (i, audio[row] if spans else audio[row, keep_from * spf : keep_to * spf].clone())
        return [out[j] for j in range(len(windows))]

"""The codec stage's generation adapter: batched, streamed codec decoding.

Each call gets one new piece of codes per request ([K, n] frames). Per request,
``item.state["history"]`` keeps the last ``context`` frames already decoded;
the window ``history + new`` of every request is right-padded into one batch,
decoded once, and each request gets the samples of its new frames only.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from omnistage.models.codec_tts.codec import load_codec
from omnistage.models.codec_tts.config import load_tts_config
from omnistage.pipeline import StageContext
from omnistage.stages.generation.engine import GenerationItem

PARAM_KEYS = {"chunk_frames", "seed"}  # "seed" arrives from the HTTP routing of generic knobs; unused


class CodecDecoderAdapter:
    def __init__(self, ctx: StageContext):
        if ctx.model is None:
            raise ValueError("codec_tts needs a model folder (omnistage.json + lm/ + codec/)")
        folder = Path(ctx.model)
        self.config = load_tts_config(folder)
        device = f"cuda:{ctx.devices[0]}" if ctx.devices and torch.cuda.is_available() else "cpu"
        self.codec = load_codec(folder / "codec", device)
        if self.codec.num_quantizers != self.config.num_quantizers or self.codec.codebook_size != self.config.codebook_size:
            raise ValueError(
                f"{folder / 'omnistage.json'}: num_quantizers/codebook_size ({self.config.num_quantizers}, "
                f"{self.config.codebook_size}) do not match the codec ({self.codec.num_quantizers}, {self.codec.codebook_size})")
        ctx_frames = self.config.decode_context_frames
        self.context = self.codec.receptive_frames if ctx_frames is None else ctx_frames
        self.calls: list[int] = []  # batch size of each decode (tests look at it)

    def check(self, item: GenerationItem) -> torch.Tensor:
        params = item.params if isinstance(item.params, dict) else {}
        unknown = sorted(set(params) - PARAM_KEYS)
        if unknown:
            raise ValueError(f"sampling_params: unknown field(s) {', '.join(unknown)} for the codec stage "
                             f"(it accepts {', '.join(sorted(PARAM_KEYS))})")
        n = params.get("chunk_frames")
        if n is not None and (isinstance(n, bool) or not isinstance(n, int) or n < 1):
            raise ValueError(f"chunk_frames: expected a positive integer, got {n!r}")
        codes = item.inputs.get("codes")
        if codes is None:
            return torch.empty(self.codec.num_quantizers, 0, dtype=torch.long)
        codes = torch.as_tensor(codes)
        k = self.codec.num_quantizers
        if codes.dim() != 2 or codes.shape[0] != k or codes.dtype not in (torch.int64, torch.int32):
            raise ValueError(f"codes: expected an integer tensor [{k}, frames], got {tuple(codes.shape)} {codes.dtype}")
        if codes.numel() and (codes.min() < 0 or codes.max() >= self.codec.codebook_size):
            raise ValueError(f"codes: values must be in 0..{self.codec.codebook_size - 1}")
        return codes.long()

    def run(self, items: list[GenerationItem]) -> list[Any]:
        results: list[Any] = [None] * len(items)
        work: list[tuple[int, torch.Tensor, int]] = []  # (item index, window, new frames)
        for i, item in enumerate(items):
            try:
                codes = self.check(item)
            except ValueError as e:
                results[i] = e
                continue
            state = item.state
            if codes.shape[1] == 0:
                results[i] = {}
                continue
            history = state.get("history")
            window = codes if history is None else torch.cat([history, codes], dim=1)
            state["history"] = window[:, window.shape[1] - min(self.context, window.shape[1]):]
            work.append((i, window, codes.shape[1]))
        if work:
            longest = max(w.shape[1] for _, w, _ in work)
            # Right padding: everything in the decoder is causal, so padded frames never reach real samples.
            batch = torch.zeros(len(work), self.codec.num_quantizers, longest, dtype=torch.long)
            for row, (_, window, _) in enumerate(work):
                batch[row, :, : window.shape[1]] = window
            audio = self.codec.decode(batch)
            self.calls.append(len(work))
            spf = self.codec.samples_per_frame
            for row, (i, window, new) in enumerate(work):
                end = window.shape[1] * spf
                results[i] = {"audio": audio[row, end - new * spf: end].clone(), "sample_rate": self.codec.sample_rate}
        return results

"""The code2wav stage's generation adapter: codec frames -> 24 kHz waveform, streamed and batched.

The reference is transformers' ``Qwen3OmniMoeCode2Wav.chunked_decode(codes, chunk_size=300,
left_context_size=25)``: chunk k covers frames [300k, 300k+300) and is decoded with the 25
frames before it as context (none for the first), keeping the samples after the context.
The decoder is causal (causal convolutions, transposed convolutions trimmed on the right,
a causal sliding-window transformer), so decoding a chunk's window only up to the frames
received so far gives exactly the first samples of the whole window's decode. Each piece
therefore re-decodes its chunk's window up to the newest frame and emits the samples not
sent yet: the streamed audio equals the reference (float rounding aside), and a request
finishes once the talker finished and every fed piece is decoded (the generation engine's
rule). Windows of concurrent requests are right-padded into one decode (causal: padding
never reaches a real sample).

Decode shapes: windows of similar lengths share a decode (a request's one-frame first piece is not
padded to another's 300-frame window), padded to a length from ``LENGTHS`` and run in batches of 1, 2,
4, 8, ... rows. On the CPU every new input shape costs oneDNN a new set of convolution kernels (20-40 ms of
compile on the tiny fixture, more than the decode), and its cache keeps ~1024 kernels (~30 shapes of this
decoder): with every window length and batch size of a busy server, the cache never held the next decode's
shape, and a first packet at concurrency 4 paid that compile. A few shapes, reused, stay compiled.
"""

from __future__ import annotations

from typing import Any

import torch

from omnistage.errors import InvalidRequestError
from omnistage.models.qwen_omni.checkpoint import load_code2wav, load_config
from omnistage.models.qwen_omni.config import CODE2WAV_PARAM_KEYS, SAMPLE_RATE
from omnistage.models.shared.codec_lm.decoder import stage_params
from omnistage.models.shared.folder_engine import model_folder, stage_cuda_device
from omnistage.pipeline import StageContext
from omnistage.stages.generation.engine import GenerationItem

CHUNK, CONTEXT = 300, 25  # chunked_decode's chunk_size and left_context_size, as generate() calls it
PARAM_KEYS = CODE2WAV_PARAM_KEYS  # the streamed pieces' sizes (edges.py), and "seed"
# decode lengths (frames): a window is right-padded to the first at least as long (the last is the longest
# window, a whole chunk with its context)
LENGTHS = (1, 2, 4, 8, 16, 32, 64, 96, 128, 192, 256, CHUNK + CONTEXT)


class Code2WavAdapter:
    def __init__(self, ctx: StageContext):
        folder = model_folder(ctx, "qwen_omni")
        device = stage_cuda_device(ctx)
        dtype = torch.float32 if device == "cpu" else torch.bfloat16
        config = load_config(folder)
        self.model = load_code2wav(folder, config, dtype, device)
        self.device = device
        self.num_quantizers = config.code2wav_config.num_quantizers
        self.codebook_size = config.code2wav_config.codebook_size
        self.upsample = int(self.model.total_upsample)
        self.sample_rate = SAMPLE_RATE
        self.calls: list[int] = []  # batch size of each decode (tests look at it)

    def check(self, item: GenerationItem) -> torch.Tensor:
        params = stage_params(item, PARAM_KEYS, "sampling_params_list[2]", "code2wav")
        for key in ("chunk_frames", "initial_codec_chunk_frames"):
            n = params.get(key)
            if n is not None and (isinstance(n, bool) or not isinstance(n, int) or n < 1):
                raise InvalidRequestError(key, f"expected a positive integer, got {n!r}")
        codes = item.inputs.get("codes")
        k = self.num_quantizers
        if codes is None:
            return torch.empty(k, 0, dtype=torch.long)
        codes = torch.as_tensor(codes)
        if codes.dim() != 2 or codes.shape[0] != k or codes.dtype not in (torch.int64, torch.int32):
            raise InvalidRequestError(
                "codes", f"expected an integer tensor [{k}, frames], got {tuple(codes.shape)} {codes.dtype}"
            )
        if codes.numel() and (codes.min() < 0 or codes.max() >= self.codebook_size):
            raise InvalidRequestError("codes", f"values must be in 0..{self.codebook_size - 1}")
        return codes.long()

    def run(self, items: list[GenerationItem]) -> list[Any]:
        results: list[Any] = [None] * len(items)
        todo: list[int] = []
        for i, item in enumerate(items):
            try:
                codes = self.check(item)
            except ValueError as e:
                results[i] = e
                continue
            st = item.state
            if "history" not in st:
                # frames from `origin` on (the current chunk's window), frames received, current chunk, its
                # samples already sent
                st.update(
                    history=torch.empty(self.num_quantizers, 0, dtype=torch.long), origin=0, frames=0, chunk=0, sent=0
                )
            if codes.shape[1] == 0:
                results[i] = {}
                continue
            st["history"] = torch.cat([st["history"], codes], dim=1)
            st["frames"] += codes.shape[1]
            results[i] = {"audio": [], "sample_rate": self.sample_rate}
            todo.append(i)
        while todo:  # each round decodes one window per request (a piece may end one chunk and start the next)
            windows = [self._window(items[i].state) for i in todo]
            audio = self._decode(windows)
            later = []
            for i, wav in zip(todo, audio):
                st = items[i].state
                chunk_audio = wav[self._context(st["chunk"]) * self.upsample :]
                results[i]["audio"].append(chunk_audio[st["sent"] :])
                st["sent"] = chunk_audio.shape[0]
                if min(st["frames"], (st["chunk"] + 1) * CHUNK) == (st["chunk"] + 1) * CHUNK:  # chunk complete
                    st["chunk"] += 1
                    st["sent"] = 0
                    start = st["chunk"] * CHUNK - self._context(st["chunk"])
                    st["history"] = st["history"][:, start - st["origin"] :]
                    st["origin"] = start
                    if st["frames"] > st["chunk"] * CHUNK:
                        later.append(i)
            todo = later
        for r in results:
            if isinstance(r, dict) and isinstance(r.get("audio"), list):
                r["audio"] = torch.cat(r["audio"])
        return results

    @staticmethod
    def _context(chunk: int) -> int:
        start = chunk * CHUNK
        return CONTEXT if start - CONTEXT > 0 else start

    def _window(self, st: dict[str, Any]) -> torch.Tensor:
        """The current chunk's frames received so far, with its left context."""
        start = st["chunk"] * CHUNK - self._context(st["chunk"])
        end = min(st["frames"], (st["chunk"] + 1) * CHUNK)
        return st["history"][:, start - st["origin"] : end - st["origin"]]

    @torch.no_grad()
    def _decode(self, windows: list[torch.Tensor]) -> list[torch.Tensor]:
        out: list[torch.Tensor] = [torch.empty(0)] * len(windows)
        for length, size, rows in decode_batches([w.shape[1] for w in windows]):
            batch = torch.zeros(size, self.num_quantizers, length, dtype=torch.long)  # rows past len(rows): padding
            for row, i in enumerate(rows):
                batch[row, :, : windows[i].shape[1]] = windows[i]
            wav = self.model(batch.to(self.device)).float().cpu()[:, 0]  # [B, samples]
            self.calls.append(len(rows))
            lost = length * self.upsample - wav.shape[1]  # trailing samples a decode of n frames never has
            for row, i in enumerate(rows):
                out[i] = wav[row, : windows[i].shape[1] * self.upsample - lost]
        return out


def decode_batches(lengths: list[int]) -> list[tuple[int, int, list[int]]]:
    """Windows (their lengths in frames) -> decodes ``(padded length, batch rows, window indices)``: windows sorted
    by length share a decode while the longest is at most twice the shortest (+ 4 frames), padded to the next of
    ``LENGTHS``; a group runs in batches of power-of-two rows (one padding row rather than one more decode)."""
    order = sorted(range(len(lengths)), key=lambda i: lengths[i])
    groups: list[list[int]] = []
    for i in order:
        if groups and lengths[i] <= 2 * lengths[groups[-1][0]] + 4:
            groups[-1].append(i)
        else:
            groups.append([i])
    out = []
    for group in groups:
        longest = lengths[group[-1]]
        length = next((n for n in LENGTHS if n >= longest), longest)
        while group:
            n = len(group)
            size = 1 << (n - 1).bit_length()  # n rounded up to a power of two...
            if size - n > 1:
                size >>= 1  # ...unless that pads more than one row: the largest power of two below
            out.append((length, size, group[:size]))
            group = group[size:]
    return out

"""The 12 Hz speech tokenizer's decoder (``speech_tokenizer/``, weights ``decoder.*``): codes [B, G, T] ->
24 kHz audio [B, T * 1920].

Re-implemented here because it exists only in the ``qwen-tts`` package (transformers 4.57-only code, no
transformers class fits: Mimi's decoder differs in its norms, MLP and vocoder). The modules carry the
package's attribute names, so the published ``speech_tokenizer/model.safetensors`` loads strictly:

    split RVQ (1 semantic + G-1 acoustic codebooks, summed)  -> causal conv (``pre_conv``)
    -> ``pre_transformer``: RMSNorm / SwiGLU layers with layer scale, RoPE, causal sliding-window attention
    -> ``upsample``: causal transposed conv + ConvNeXt block per ratio
    -> ``decoder``: causal conv, SnakeBeta + causal transposed conv + 3 dilated residual units per rate,
       SnakeBeta, causal conv -> clamp to [-1, 1]

Everything is causal (left padding, transposed convs trimmed on the right, attention over the last
``sliding_window`` frames), so the audio of frames ``s..e`` depends on codes up to ``e`` and at most
``receptive_frames`` before ``s``, and right padding a batch never reaches real samples. That window is
long (2 x 71 frames for the tiny decoder, 8 x 71 for the released one) and almost all of it is attention,
so streaming is stateful there and exact-context only where that is cheap (``decoder_adapter``): the
RVQ / pre-conv / transformer keep their state per request (the pre-conv's last inputs, each layer's
key/value window), the convolutions after them re-run over ``conv_frames`` (a few) earlier frames. The
streamed audio equals the whole decode (tests: <= 1e-5).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from omnistage.models.qwen3_tts.decoder_layers import (
    CausalConv,
    CausalTransConv,
    ConvNeXt,
    DecoderBlock,
    ResidualUnit,
    SnakeBeta,
    SplitRVQ,
    Transformer,
)


class SpeechDecoder(nn.Module):
    def __init__(self, cfg: dict[str, Any]):
        super().__init__()
        self.num_quantizers = int(cfg["num_quantizers"])
        self.codebook_size = int(cfg["codebook_size"])
        latent, dim = cfg["latent_dim"], cfg["decoder_dim"]
        self.quantizer = SplitRVQ(self.num_quantizers, self.codebook_size, cfg["codebook_dim"])
        self.pre_conv = CausalConv(cfg["codebook_dim"], latent, 3)
        self.pre_transformer = Transformer(cfg)
        self.upsample = nn.ModuleList(
            nn.ModuleList([CausalTransConv(latent, latent, f, f), ConvNeXt(latent)]) for f in cfg["upsampling_ratios"]
        )
        rates = list(cfg["upsample_rates"])
        blocks: list[nn.Module] = [CausalConv(latent, dim, 7)]
        blocks += [DecoderBlock(dim // 2**i, dim // 2 ** (i + 1), r) for i, r in enumerate(rates)]
        out = dim // 2 ** len(rates)
        blocks += [SnakeBeta(out), CausalConv(out, 1, 7)]
        self.decoder = nn.ModuleList(blocks)
        self.samples_per_frame = int(math.prod(rates) * math.prod(cfg["upsampling_ratios"]))
        self.receptive_frames = receptive_frames(cfg)
        self.conv_frames = conv_frames(cfg)

    def forward(self, codes: torch.Tensor) -> torch.Tensor:
        """codes [B, G, T] -> audio [B, 1, T * samples_per_frame] in [-1, 1]."""
        h = self.pre_conv(self.quantizer.decode(codes)).transpose(1, 2)
        return self.vocode(self.pre_transformer(h).transpose(1, 2))

    def hidden(self, codes: torch.Tensor, state: dict[str, Any]) -> torch.Tensor:
        """One row's next frames codes [1, G, n] -> the transformer's output for them [1, latent, n], continuing
        ``state`` (the pre-conv's last inputs and the transformer's key/value window): what the whole
        forward computes for those frames."""
        q = self.quantizer.decode(codes)
        tail = state.get("pre_conv")
        if tail is None:  # the causal conv's zero padding in front of the first frame
            tail = q.new_zeros(q.shape[0], q.shape[1], self.pre_conv.padding)
        x = torch.cat([tail, q], dim=2)
        state["pre_conv"] = x[:, :, x.shape[2] - self.pre_conv.padding :]
        h = self.pre_conv.conv(x).transpose(1, 2)
        return self.pre_transformer(h, state).transpose(1, 2)

    def vocode_stream(self, h: torch.Tensor, states: list[list[torch.Tensor]]) -> torch.Tensor:
        """``vocode`` of each row's next frames [B, latent, n], continuing ``states[b]`` (row b's last inputs
        of every causal convolution, in walk order; empty for a row's first piece, which starts from the
        zeros the whole decode pads with): what ``vocode`` of all of a row's frames gives for these."""
        j = 0

        def carried(x: torch.Tensor, width: int) -> torch.Tensor:
            """x with each row's last ``width`` earlier inputs of this layer in front; stores the new ones."""
            nonlocal j
            past = [row[j] if len(row) > j else x.new_zeros(1, x.shape[1], width) for row in states]
            full = torch.cat([torch.cat(past), x], dim=2)
            for b, row in enumerate(states):
                tail = full[b : b + 1, :, full.shape[2] - width :]
                row[j : j + 1] = [tail]
            j += 1
            return full

        def conv(m: CausalConv, x: torch.Tensor) -> torch.Tensor:
            if m.stride != 1:
                raise ValueError("the streamed decoder expects stride-1 convolutions")
            return m.conv(carried(x, m.padding)) if m.padding else m.conv(x)

        def transposed(m: CausalTransConv, x: torch.Tensor) -> torch.Tensor:
            r, n = m.conv.stride[0], x.shape[2]
            return m.conv(carried(x, 1))[..., r : (n + 1) * r]  # the previous input's overlap, without its own

        for up, block in self.upsample:
            h = transposed(up, h)
            y = conv(block.dwconv, h).transpose(1, 2)
            h = h + (block.gamma * block.pwconv2(F.gelu(block.pwconv1(block.norm(y))))).transpose(1, 2)
        for m in self.decoder:
            if isinstance(m, CausalConv):
                h = conv(m, h)
            elif isinstance(m, DecoderBlock):
                for sub in m.block:
                    if isinstance(sub, CausalTransConv):
                        h = transposed(sub, h)
                    elif isinstance(sub, ResidualUnit):
                        h = h + sub.conv2(sub.act2(conv(sub.conv1, sub.act1(h))))
                    else:
                        h = sub(h)
            else:
                h = m(h)
        return h.clamp(-1, 1)

    def vocode(self, h: torch.Tensor) -> torch.Tensor:
        """The transformer's output [B, latent, T] -> audio [B, 1, T * samples_per_frame] (causal convolutions
        only: ``conv_frames`` earlier frames of ``h`` are all a frame's audio can depend on)."""
        for up, block in self.upsample:
            h = block(up(h))
        for m in self.decoder:
            h = m(h)
        return h.clamp(-1, 1)


def conv_frames(cfg: dict[str, Any]) -> int:
    """How many earlier frames of the transformer's output can change a frame's audio through the upsampling
    and vocoder convolutions (an upper bound): each layer's look-back in its own input steps, over the steps
    per frame at its rate, summed along the path."""
    frames, rate = 0.0, 1
    for f in cfg["upsampling_ratios"]:  # transposed conv kernel == stride: no look-back; ConvNeXt kernel 7
        rate *= f
        frames += 6 / rate
    frames += 6 / rate  # the decoder's first conv
    for r in cfg["upsample_rates"]:
        frames += 1 / rate  # transposed conv, kernel 2r: one input step back
        rate *= r
        frames += sum(6 * d for d in (1, 3, 9)) / rate
    frames += 6 / rate  # last conv
    return math.ceil(frames) + 1


def receptive_frames(cfg: dict[str, Any]) -> int:
    """How many earlier code frames can change a frame's audio: the pre-conv's 2, each attention layer's
    window, then the convolutions'."""
    return 2 + cfg["num_hidden_layers"] * (cfg["sliding_window"] - 1) + conv_frames(cfg)


class SpeechTokenizerDecoder:
    """What ``codec_tts``'s streamed decoder adapter drives (``causal`` codec: exact with left context)."""

    causal = True

    def __init__(self, folder: Path, device: str = "cpu", dtype: torch.dtype = torch.float32):
        import json

        from omnistage.models.shared.checkpoint import read_tensors

        cfg = json.loads((folder / "config.json").read_text())
        dec = cfg["decoder_config"]
        self.model = SpeechDecoder(dec)
        self.model.load_state_dict(read_tensors(folder, "decoder."), strict=True)
        self.model = self.model.to(device=device, dtype=dtype).eval()
        self.device = device
        self.sample_rate = int(cfg.get("output_sample_rate", 24000))
        self.num_quantizers = self.model.num_quantizers
        self.codebook_size = self.model.codebook_size
        self.samples_per_frame = int(cfg.get("decode_upsample_rate", self.model.samples_per_frame))
        if self.samples_per_frame != self.model.samples_per_frame:
            raise ValueError(
                f"{folder}: decode_upsample_rate {self.samples_per_frame} != the decoder's "
                f"upsampling ({self.model.samples_per_frame})"
            )
        self.receptive_frames = self.model.receptive_frames
        self.conv_frames = self.model.conv_frames

    @torch.no_grad()
    def decode(self, codes: torch.Tensor) -> torch.Tensor:
        """codes [B, G, T] -> float32 audio [B, T * samples_per_frame]."""
        audio = self.model(codes.to(self.device))
        return audio[:, 0].float().cpu()


def decoder_adapter(ctx: Any) -> Any:
    """The decoder stage's generation adapter (built at stage start: torch + transformers imports here)."""
    from omnistage.models.qwen3_tts.config import CHUNK_FRAMES, INITIAL_CHUNK_FRAMES
    from omnistage.models.shared.codec_lm.decoder import CodecDecoderAdapter
    from omnistage.models.shared.folder_engine import model_folder, stage_cuda_device

    class StreamingDecoderAdapter(CodecDecoderAdapter):
        """Streams statefully: each request's new frames go through the RVQ, pre-conv and sliding-window
        transformer continuing its state (``SpeechDecoder.hidden``: the pre-conv's last inputs, each
        layer's key/value window), then through the upsampling + vocoder convolutions continuing their
        states (``SpeechDecoder.vocode_stream``: each causal convolution's last inputs); pieces of the same
        length from several requests share one vocoder call. No frame is decoded twice. The whole
        (non-streamed) path is one forward over reference + generated codes. Both equal the whole decode
        (tests: <= 1e-5)."""

        def __init__(self) -> None:  # not super().__init__: that one reads a codec_tts folder
            folder = model_folder(ctx, "qwen3_tts")
            self.serve_own_codec(
                SpeechTokenizerDecoder(folder / "speech_tokenizer", stage_cuda_device(ctx)),
                CHUNK_FRAMES,
                INITIAL_CHUNK_FRAMES,
            )
            self.context, self.lookahead = 0, 0  # stateful: no frame is re-decoded

        @torch.no_grad()
        def run(self, items: list[Any]) -> list[Any]:
            model, spf = self.codec.model, self.codec.samples_per_frame
            results: list[Any] = [None] * len(items)
            pieces: list[tuple[int, torch.Tensor, int]] = []  # (item, hidden [latent, n], frames to skip)
            for i, item in enumerate(items):
                try:
                    codes, context, _, _ = self.check(item)
                except ValueError as e:
                    results[i] = e
                    continue
                state, results[i] = item.state, {}
                if "streamed" not in state:  # the first piece: an in-context clone's reference codes go first
                    ahead = context if context is not None else codes[:, :0]
                    state.update(
                        streamed=bool(item.inputs.get("streamed", not item.last)), skip=ahead.shape[1], vocoder=[]
                    )
                    codes = torch.cat([ahead, codes], dim=1)
                    state["codes"] = codes[:, :0] if state["streamed"] else codes
                elif not state["streamed"]:
                    state["codes"] = torch.cat([state["codes"], codes], dim=1)
                if not state["streamed"]:
                    if item.last and state["codes"].shape[1] > state["skip"]:
                        audio = self.codec.decode(state["codes"][None])[0]
                        self.calls.append(1)
                        results[i] = {"audio": audio[state["skip"] * spf :], "sample_rate": self.codec.sample_rate}
                    continue
                if codes.shape[1] == 0:
                    continue
                new = model.hidden(codes[None].to(self.codec.device), state)[0]
                skip = min(state["skip"], new.shape[1])
                state["skip"] -= skip
                pieces.append((i, new, skip))
            by_len: dict[int, list[int]] = {}
            for k, (_, new, _) in enumerate(pieces):
                by_len.setdefault(new.shape[1], []).append(k)
            for group in by_len.values():  # pieces of one length share a vocoder call, their states stacked
                batch = torch.stack([pieces[k][1] for k in group])
                audio = model.vocode_stream(batch, [items[pieces[k][0]].state["vocoder"] for k in group])
                self.calls.append(len(group))
                audio = audio[:, 0].float().cpu()
                for row, k in enumerate(group):
                    i, _, skip = pieces[k]
                    piece = audio[row, skip * spf :].clone()
                    if piece.numel():
                        results[i] = {"audio": piece, "sample_rate": self.codec.sample_rate}
            return results

    return StreamingDecoderAdapter()

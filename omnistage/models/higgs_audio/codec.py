"""Higgs Audio v2's decoder stage: the audio tokenizer's decode path (``shared/higgs_tokenizer/decoder.py``) streamed
per frame group.

The DAC decoder's samples depend only on the codes within ``receptive_frames`` of their frame on either side:
a streamed block decoded with that many frames before and after it equals the whole decode up to float
rounding (``CodecDecoderAdapter``'s non-causal schedule with exact context).
"""

from __future__ import annotations

from pathlib import Path

import torch

from omnistage.models.higgs_audio.config import CHUNK_FRAMES, INITIAL_CHUNK_FRAMES
from omnistage.models.shared.codec_lm.config import TTSConfig
from omnistage.models.shared.codec_lm.decoder import CodecDecoderAdapter
from omnistage.models.shared.higgs_tokenizer.decoder import HiggsCodec
from omnistage.pipeline import StageContext


class HiggsCodecAdapter(CodecDecoderAdapter):
    def __init__(self, ctx: StageContext):  # not super().__init__: that one reads a codec_tts folder
        if ctx.model is None:
            raise ValueError("higgs_audio needs a model folder")
        device = f"cuda:{ctx.devices[0]}" if ctx.devices and torch.cuda.is_available() else "cpu"
        self.codec = HiggsCodec(Path(ctx.model) / "audio_tokenizer", device)
        self.config = TTSConfig(
            codebook_size=self.codec.codebook_size,
            num_quantizers=self.codec.num_quantizers,
            chunk_frames=CHUNK_FRAMES,
            initial_chunk_frames=INITIAL_CHUNK_FRAMES,
        )
        # exact: every block decoded with the decoder's whole receptive field on both sides; only the block's
        # own samples are computed (``HiggsCodec.decode_span``)
        self.context = self.lookahead = self.codec.receptive_frames
        self.calls: list[int] = []

"""Higgs Audio v2's decoder stage: the audio tokenizer's decode path (``shared/higgs_tokenizer/decoder.py``) streamed
per frame group.

The DAC decoder's samples depend only on the codes within ``receptive_frames`` of their frame on either side:
a streamed block decoded with that many frames before and after it equals the whole decode up to float
rounding (``CodecDecoderAdapter``'s non-causal schedule with exact context).
"""

from __future__ import annotations

from omnistage.models.higgs_audio.config import CHUNK_FRAMES, INITIAL_CHUNK_FRAMES
from omnistage.models.shared.codec_lm.decoder import CodecDecoderAdapter
from omnistage.models.shared.folder_engine import model_folder, stage_cuda_device
from omnistage.models.shared.higgs_tokenizer.decoder import HiggsCodec
from omnistage.pipeline import StageContext


class HiggsCodecAdapter(CodecDecoderAdapter):
    def __init__(self, ctx: StageContext):  # not super().__init__: that one reads a codec_tts folder
        codec = HiggsCodec(model_folder(ctx, "higgs_audio") / "audio_tokenizer", stage_cuda_device(ctx))
        self.serve_own_codec(codec, CHUNK_FRAMES, INITIAL_CHUNK_FRAMES)
        # exact: every block decoded with the decoder's whole receptive field on both sides; only the block's
        # own samples are computed (``HiggsCodec.decode_span``)
        self.context = self.lookahead = codec.receptive_frames

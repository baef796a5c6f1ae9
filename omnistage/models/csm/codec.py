"""CSM's codec stage: codec_tts's streamed Mimi decoder over the Mimi inside the CSM checkpoint
(``codec_model.*`` weights, ``config.codec_config``), loaded without the backbone."""

from __future__ import annotations

from pathlib import Path

import torch

from omnistage.models.csm.config import CHUNK_FRAMES, INITIAL_CHUNK_FRAMES
from omnistage.models.shared.codec_lm.codec import MimiCodec, mimi_receptive_frames
from omnistage.models.shared.codec_lm.decoder import CodecDecoderAdapter
from omnistage.models.shared.folder_engine import model_folder, stage_cuda_device
from omnistage.pipeline import StageContext


class CsmMimi(MimiCodec):
    def __init__(self, folder: Path, device: str = "cpu", dtype: torch.dtype = torch.float32):
        from transformers import AutoConfig, MimiModel

        from omnistage.models.shared.checkpoint import read_tensors

        cfg = AutoConfig.from_pretrained(str(folder)).codec_config
        model = MimiModel(cfg)
        model.load_state_dict(read_tensors(folder, "codec_model."), strict=True)
        self.model = model.to(device=device, dtype=dtype).eval()
        self.device = device
        self.sample_rate = int(cfg.sampling_rate)
        self.num_quantizers = int(cfg.num_quantizers)
        self.codebook_size = int(cfg.codebook_size)
        self.samples_per_frame = round(cfg.sampling_rate / cfg.frame_rate)
        self.receptive_frames = mimi_receptive_frames(cfg)


class CsmCodecAdapter(CodecDecoderAdapter):
    def __init__(self, ctx: StageContext):  # not super().__init__: that one reads a codec_tts folder
        codec = CsmMimi(model_folder(ctx, "csm"), stage_cuda_device(ctx))
        self.serve_own_codec(codec, CHUNK_FRAMES, INITIAL_CHUNK_FRAMES)
        self.context, self.lookahead = codec.receptive_frames, 0  # causal: exact with left context only

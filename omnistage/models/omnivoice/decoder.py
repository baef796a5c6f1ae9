"""OmniVoice's decoder stage: the Higgs Audio v2 tokenizer's decoder over a whole utterance's codes, then the
package's post-processing (``postprocess.py``). One decode per request: the utterance exists only whole, and
a decode batched with others of the same length would round differently from the request's solo one."""

from __future__ import annotations

from typing import Any

import torch

from omnistage.errors import InvalidRequestError
from omnistage.models.omnivoice.postprocess import post_process
from omnistage.models.shared.folder_engine import model_folder, stage_cuda_device
from omnistage.models.shared.higgs_tokenizer.decoder import HiggsCodec
from omnistage.pipeline import StageContext
from omnistage.stages.generation.adapter import GenerationItem

PARAM_KEYS = {"seed"}  # the routed generic knob; the decode draws nothing


class OmniVoiceDecoder:
    def __init__(self, ctx: StageContext):
        self.codec = HiggsCodec(model_folder(ctx, "omnivoice") / "audio_tokenizer", stage_cuda_device(ctx))

    def _codes(self, item: GenerationItem) -> torch.Tensor:
        unknown = sorted(set(item.params or {}) - PARAM_KEYS) if isinstance(item.params, dict) else []
        if unknown:
            raise InvalidRequestError(unknown[0], "not a parameter of OmniVoice's decoder stage")
        codes = torch.as_tensor(item.inputs.get("codes"))
        k, size = self.codec.num_quantizers, self.codec.codebook_size
        if codes.dim() != 2 or codes.shape[0] != k or codes.shape[1] == 0 or codes.is_floating_point():
            raise InvalidRequestError("codes", f"expected integer codes [{k}, frames], got {tuple(codes.shape)}")
        if codes.min() < 0 or codes.max() >= size:
            raise InvalidRequestError("codes", f"values must be in 0..{size - 1}")
        return codes.long()

    def run(self, items: list[GenerationItem]) -> list[Any]:
        out: list[Any] = []
        for item in items:
            try:
                codes = self._codes(item)
            except ValueError as e:
                out.append(e)
                continue
            audio = self.codec.decode(codes.unsqueeze(0))[0].numpy()
            wav = post_process(audio, self.codec.sample_rate, item.inputs.get("ref_rms"))
            out.append({"audio": torch.from_numpy(wav), "sample_rate": self.codec.sample_rate})
        return out

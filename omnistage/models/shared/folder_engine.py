"""What every speech family's model stages start with: the stage's model folder and device, and the step
engine over a model built from that folder (the talker / backbone of csm, higgs_audio, vibevoice, voxcpm,
omnivoice, qwen3_tts and the omni talkers)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any, ClassVar

import torch

from omnistage.pipeline import StageContext
from omnistage.stages.ar.engine import StepEngine
from omnistage.stages.base import StageRequest


def model_folder(ctx: StageContext, family: str) -> Path:
    """The stage's model folder; a stage of these families has nothing to load without one."""
    if ctx.model is None:
        raise ValueError(f"{family} needs a model folder")
    return Path(ctx.model)


def stage_cuda_device(ctx: StageContext) -> str:
    """The stage's first GPU when it has one and CUDA is up, else the CPU."""
    return f"cuda:{ctx.devices[0]}" if ctx.devices and torch.cuda.is_available() else "cpu"


class FolderStepEngine(StepEngine):
    """``StepEngine`` over ``model_class(folder, device, dtype)``; ``family`` names the family in errors, and
    ``read_defaults(folder)`` (when set) gives ``self.defaults``, the checkpoint's own sampling defaults."""

    family: ClassVar[str]
    model_class: ClassVar[Callable[..., Any]]
    read_defaults: ClassVar[Callable[[Path], Any] | None] = None

    def __init__(self, ctx: StageContext):
        folder = model_folder(ctx, self.family)
        super().__init__(ctx)
        self.folder = folder
        read = type(self).read_defaults
        self.defaults = read(folder) if read is not None else None

    def load_model(self) -> Any:
        return type(self).model_class(self.folder, *self.device_and_dtype())

    def whole_input(self, req: StageRequest) -> StageRequest:
        """``req`` when it carries its whole input; a streamed (chunked) input is refused."""
        if req.stream_inputs:
            raise ValueError(f"stage {self.stage_id} takes its whole input at once (no async chunk input)")
        return req

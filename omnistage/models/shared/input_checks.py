"""Request checks the diffusion families share: what a stage does not use is refused (a 400 naming the field)
rather than ignored: an input image for a checkpoint that generates from text alone, a knob it has no use for."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from omnistage.errors import InvalidRequestError

# what the text-to-audio DiTs (stable_audio, stable_audio3, longcat_audio) take no value for: the length is set
# with "duration"
AUDIO_UNUSED = ("height", "width", "num_frames", "true_cfg_scale", "strength")


def refuse_images(job: Any, why: str) -> None:
    """Refuse ``job``'s input images, ``why`` saying what this checkpoint is (and what would take one)."""
    if job.images:
        raise InvalidRequestError("multi_modal_data.image", why)


def refuse_params(params: Any, names: Iterable[str], why: str, prefix: str = "") -> None:
    """Refuse the first of ``names`` the request set on ``params`` (a 400 naming ``prefix + name``), ``why`` saying
    why this stage does not use it."""
    for name in names:
        if getattr(params, name) is not None:
            raise InvalidRequestError(prefix + name, why)


def one_clip_from_text(job: Any, model: str) -> None:
    """A text-to-audio DiT's request: no input image, none of ``AUDIO_UNUSED``, one clip (``model`` names it in
    the errors)."""
    refuse_images(job, f"{model} is text-to-audio only; it takes no image")
    refuse_params(job.params, AUDIO_UNUSED, f"not used by {model} (set the length with 'duration')")
    if job.params.num_outputs_per_prompt != 1:
        raise InvalidRequestError("num_outputs_per_prompt", f"{model} returns one clip per request")

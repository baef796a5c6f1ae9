"""Server-wide caps on what one request may ask for, checked before any model work.

The request body's own validation (protocol.py) only bounds values loosely
(16384 pixels a side, 1000 steps); these are the operator's limits
(``omnistage serve --max-image-pixels ...``), applied to every stage's merged
parameters of a parsed request, so a knob that arrives through
``sampling_params_list`` is bounded as well. Values equal to the stage's
deploy defaults are the operator's own choice and are not held to the caps
(a speech model's default ``max_tokens`` may exceed a ``--max-tokens`` meant
for what callers ask). A request
above a cap is an ``InvalidRequestError`` (HTTP 400) naming the field the
caller sent (``size`` when the size came as ``"WxH"``). Cheap to import: the
``serve`` command's ``--help`` shows the defaults.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from omnistage.errors import InvalidRequestError

if TYPE_CHECKING:
    from omnistage.engine.request import OmniRequest
    from omnistage.params import RequestKnobs

DEFAULT_MAX_IMAGE_PIXELS = 4096 * 4096
DEFAULT_MAX_NUM_FRAMES = 512
DEFAULT_MAX_INFERENCE_STEPS = 200


@dataclass(frozen=True)
class RequestLimits:
    """``None`` switches a cap off."""

    max_image_pixels: int | None = DEFAULT_MAX_IMAGE_PIXELS  # height x width of one image or video frame
    max_num_frames: int | None = DEFAULT_MAX_NUM_FRAMES  # frames of one video
    max_inference_steps: int | None = DEFAULT_MAX_INFERENCE_STEPS  # denoising steps
    max_tokens: int | None = None  # tokens an llm stage generates (None: the model's context length bounds it)

    def check(
        self, req: OmniRequest, knobs: RequestKnobs | None = None, defaults: Sequence[Mapping[str, Any]] = ()
    ) -> None:
        """Raise ``InvalidRequestError`` naming the field when any stage's parameters exceed a cap
        (``defaults``: each stage's deploy defaults, exempt)."""
        sent = knobs.model_fields_set if knobs is not None else set()
        sized = knobs is not None and knobs.size is not None

        def name(sid: int, key: str) -> str:
            if key in ("height", "width") and sized and key not in sent:
                return "size"
            if key in sent:
                return key
            if key == "max_tokens" and "max_completion_tokens" in sent:
                return "max_completion_tokens"
            return f"sampling_params_list[{sid}].{key}"  # not a top-level knob: a per-stage or deploy value

        for sid, params in enumerate(req.sampling_params):
            own = defaults[sid] if sid < len(defaults) else {}
            values = _values(params)
            asked = {k for k, v in values.items() if v is not None and v != own.get(k)}  # not the operator's default
            height, width = values["height"], values["width"]
            # a lone side counts as a square: the model's default for the other side is not known here
            height, width = height or width, width or height
            if (
                self.max_image_pixels is not None
                and asked & {"height", "width"}
                and height * width > self.max_image_pixels
            ):
                field = name(sid, "height" if "height" in asked and ("height" in sent or not sized) else "width")
                raise InvalidRequestError(
                    field,
                    f"{width}x{height} is {width * height} pixels, above this "
                    f"server's limit of {self.max_image_pixels} (--max-image-pixels)",
                )
            for key, cap, flag in (
                ("num_frames", self.max_num_frames, "--max-num-frames"),
                ("num_inference_steps", self.max_inference_steps, "--max-inference-steps"),
                ("max_tokens", self.max_tokens, "--max-tokens"),
            ):
                value = values[key]
                if cap is not None and key in asked and isinstance(value, int) and value > cap:
                    field = name(sid, key)
                    raise InvalidRequestError(field, f"{value} is above this server's limit of {cap} ({flag})")


def _values(params: Any) -> dict[str, Any]:
    """The capped knobs of one stage's parameters (typed diffusion params, a merged dict, or an engine's own
    params object such as vLLM's ``SamplingParams``)."""
    keys = ("height", "width", "num_frames", "num_inference_steps", "max_tokens")
    if isinstance(params, Mapping):
        return {k: params.get(k) for k in keys}
    return {k: getattr(params, k, None) for k in keys}

"""An error names the field the caller sent, not the engine's name for it.

The routes turn HTTP fields into the engine's parameters: ``size`` into ``height`` / ``width``, ``seconds`` x
``fps`` into ``num_frames``, an uploaded ``image`` / ``input_reference`` or an ``image_url`` into
``multi_modal_data.image``, a ``video_reference`` (or a video uploaded as ``input_reference``) into
``multi_modal_data.video``, an uploaded ``mask`` into ``multi_modal_data.mask``. A stage that refuses one of
those names its own parameter; the route says it again in the caller's words before answering.
"""

from __future__ import annotations

from collections.abc import Collection

from omnistage.server.errors import APIError

_IMAGE = "multi_modal_data.image"
_VIDEO = "multi_modal_data.video"
_MASK = "multi_modal_data.mask"


def as_sent(
    err: APIError, sent: Collection[str], image_field: str | None = None, video_field: str | None = None
) -> APIError:
    """``err`` with its ``param`` (and the message's leading name) in the caller's words: ``sent`` are the fields
    the request carried, ``image_field`` / ``video_field`` the ones its input images / video came in."""
    param = err.param or ""
    if param == "num_frames" and "num_frames" not in sent and "seconds" in sent:
        new = "seconds"
    elif param in ("height", "width") and param not in sent and "size" in sent:
        new = "size"
    elif image_field is not None and param.startswith(_IMAGE):
        new = image_field + param[len(_IMAGE) :]  # (an index, e.g. image[1], stays)
    elif video_field is not None and param.startswith(_VIDEO):
        new = video_field + param[len(_VIDEO) :]
    elif param.startswith(_MASK):  # (only the video routes take a mask)
        new = "mask" + param[len(_MASK) :]
    else:
        return err
    message = err.message.replace(f"{param}: ", f"{new}: ", 1)
    return APIError(err.status, message, new, err.code, err.type, err.headers)

"""The Qwen2-VL processor of the edit pipelines, where transformers cannot build it whole.

``QwenImageEditPipeline`` / ``QwenImageEditPlusPipeline`` feed their input
images through transformers' ``Qwen2VLProcessor``. In transformers 5 that
processor always has a video half, and video processors exist only with
torchvision installed; the CPU build of torch this project pins has no
matching torchvision, so ``from_pretrained`` of an edit checkpoint fails there.
The edit pipelines never pass videos, so without torchvision the folder's
processor is built from its image processor and tokenizer with the video half
left empty; it is still transformers' own ``Qwen2VLProcessor.__call__`` that
runs. With torchvision, diffusers loads the real processor and this is unused.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any


def needs_image_only_processor() -> bool:
    from transformers.utils import is_torchvision_available

    return not is_torchvision_available()


def image_only_processor(folder: str | Path) -> Any:
    """The checkpoint's ``processor/`` folder as a Qwen2VLProcessor without a video processor."""
    from transformers import AutoImageProcessor, AutoTokenizer, Qwen2VLProcessor

    class ImageOnlyQwen2VLProcessor(Qwen2VLProcessor):
        def check_argument_for_proper_class(self, argument_name: str, argument: Any) -> Any:
            # the one slot left empty: videos are never passed by the edit pipelines
            if argument_name == "video_processor" and argument is None:
                return None
            return super().check_argument_for_proper_class(argument_name, argument)

    folder = Path(folder)
    return ImageOnlyQwen2VLProcessor(image_processor=AutoImageProcessor.from_pretrained(folder),
                                     tokenizer=AutoTokenizer.from_pretrained(folder))

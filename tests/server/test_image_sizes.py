"""The sizes a model card lists (omnistage/server/image_sizes.py, read from the folder's configs without loading
the model) against the loaded model's own answer: the adapter's native size and the largest side its check lets
through, for the demo and a tiny SD3 folder."""

from __future__ import annotations

import pytest
import torch

from omnistage.info import PipelineInfo
from omnistage.models.demo import WEIGHTS
from omnistage.models.demo.adapter import DemoAdapter
from omnistage.models.shared.sd3_adapter import SD3Adapter
from omnistage.server.image_sizes import folder_sizes, image_sizes


@pytest.mark.parametrize("which", ["demo", "sd3"])
def test_folder_sizes_equal_the_loaded_models(which, tiny_model):
    folder, family = (str(WEIGHTS), DemoAdapter) if which == "demo" else (str(tiny_model("sd3")), SD3Adapter)
    adapter = family.load(folder, torch.float32, torch.device("cpu"))
    sizes = folder_sizes(folder)
    side = adapter.default_size()
    assert sizes == {"native": [side, side], "max_side": adapter.max_side(), "multiple": adapter.size_multiple()}


def test_choices_stay_within_the_limits():
    demo = image_sizes(PipelineInfo(), str(WEIGHTS), {"width": 64, "height": 64}, 4096 * 4096)
    assert demo == {
        "native": "64x64",
        "max_side": 256,
        "multiple": 4,
        "choices": ["32x32", "64x64", "128x128", "256x256"],
    }
    # the server's --max-image-pixels bounds the list too; the native size is always offered
    assert image_sizes(PipelineInfo(), str(WEIGHTS), {"width": 64, "height": 64}, 64 * 64)["choices"] == [
        "32x32",
        "64x64",
    ]
    # no folder: a family's declared sizes, a non-square native size scaled on both sides
    declared = image_sizes(PipelineInfo(image_size={"native": [80, 48], "multiple": 16}), None, {}, None)
    assert declared["choices"] == ["80x48", "160x96", "320x192"]  # 40x24: not a multiple of 16
    assert image_sizes(PipelineInfo(), None, {}, None) is None  # nothing known: the card has no image_sizes

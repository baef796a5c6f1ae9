"""The sd3 family's adapter, loading a folder that has no T5 encoder."""

from __future__ import annotations

from omnistage.models.shared.sd3_adapter import SD3Adapter


class DemoAdapter(SD3Adapter):
    # diffusers saves a missing T5 as [null, null] but refuses to load it unless told it is absent;
    # the SD3 pipeline then feeds zeros in its place (what the demo was trained with).
    skip_components = ("text_encoder_3", "tokenizer_3")

"""Built-in model families.

A family is one folder exporting ``PIPELINES`` (its pipeline declarations) and
``TINY`` (tiny-fixture builders by name, for ``python -m omnistage.testing.tiny``).
Adding one is its folder plus one import line here. Importing a family is
cheap: models load only when a stage starts.
"""

from omnistage.models import (
    chat,
    codec_tts,
    csm,
    demo,
    flux,
    glm_image,
    prompt_expand,
    qwen2_5_omni,
    qwen_image,
    qwen_omni,
    sd,
    sd3,
    wan,
    whisper,
    z_image,
)

# whisper before chat: chat claims any vLLM generative architecture, Whisper's too
FAMILIES = (sd3, sd, qwen_omni, qwen2_5_omni, whisper, chat, prompt_expand, glm_image, demo, wan, codec_tts, flux,
            z_image, qwen_image, csm)

"""Built-in model families.

A family is one folder exporting ``PIPELINES`` (its pipeline declarations) and
``TINY`` (tiny-fixture builders by name, for ``python -m omnistage.testing.tiny``).
Adding one is its folder plus one import line here (and its place in
``FAMILIES``). Importing this package registers every family in the registry
of omnistage.pipeline, which imports none of them; the entry points that need
every family (``AsyncOmni`` / ``Omni``, the CLI, ``omnistage pipelines``, the
tiny-fixture builder) import it. Importing a family is cheap: models load only
when a stage starts.

No family imports another: what several use lives in ``shared/`` (not a family: it
declares no pipeline). The steps of adding a family: docs/adding-a-family.md.
"""

from omnistage.models import (
    chat,
    codec_tts,
    cosmos3,
    csm,
    demo,
    ernie_image,
    flux,
    flux2,
    glm_image,
    helios,
    higgs_audio,
    hunyuan_video15,
    longcat_audio,
    longcat_image,
    ltx2,
    moshi,
    omnivoice,
    ovis_image,
    pixart_sigma,
    prompt_expand,
    qwen2_5_omni,
    qwen3_asr,
    qwen3_tts,
    qwen_image,
    qwen_image_21,
    qwen_image_layered,
    qwen_omni,
    sana,
    sd,
    sd3,
    speech_chat,
    stable_audio,
    stable_audio3,
    vibevoice,
    voxcpm,
    voxtral,
    wan,
    wan_vace,
    whisper,
    xtts,
    z_image,
)
from omnistage.pipeline import register_family

# whisper, qwen3_asr, vibevoice and voxtral before chat: chat claims any vLLM generative architecture, theirs too
FAMILIES = (
    sd3,
    sd,
    qwen_omni,
    qwen2_5_omni,
    whisper,
    qwen3_asr,
    vibevoice,
    voxtral,
    chat,
    prompt_expand,
    glm_image,
    demo,
    wan,
    codec_tts,
    flux,
    z_image,
    qwen_image,
    qwen_image_21,
    csm,
    higgs_audio,
    omnivoice,
    ltx2,
    qwen3_tts,
    pixart_sigma,
    sana,
    flux2,
    hunyuan_video15,
    helios,
    speech_chat,
    ovis_image,
    longcat_image,
    stable_audio,
    longcat_audio,
    cosmos3,
    ernie_image,
    qwen_image_layered,
    wan_vace,
    xtts,
    moshi,
    voxcpm,
    stable_audio3,
)

for _family in FAMILIES:
    register_family(_family)

"""``omnivoice``: k2-fsa's OmniVoice — a masked-diffusion language model over 8 codebooks of the Higgs Audio
v2 tokenizer, which fills the whole utterance's codes in a fixed number of unmasking steps (no frame-by-frame
generation), then decodes them to 24 kHz speech.

Stage 0 ``codes`` (``ar``: omnistage's step-batched engine, ``engine.py`` / ``model.py``): one unmasking step
of every running request per forward, the utterance's codes emitted whole with its last step. It takes the
request's diffusion knobs: ``num_inference_steps`` (the unmasking steps, default 32), ``guidance_scale``,
``seed``; and ``duration`` (seconds) in its params. Stage 1 ``decoder`` (generation): the Higgs Audio v2
tokenizer's decoder (``shared/higgs_tokenizer/decoder.py``) and the package's silence trimming, level and fades
(``postprocess.py``). Voices: ``default`` (the model's own for the text), designed through ``instructions``
(``female, low pitch``), or cloned from ``ref_audio`` + ``ref_text`` (or a registered voice), the clip
encoded by the tokenizer's encoder (``clone.py``); ``language`` and ``speed`` as on /v1/audio/speech.

Tiny fixture: ``tests/models/omnivoice/tiny/`` (written by the reference package's own classes).
"""

from __future__ import annotations

from omnistage.info import PipelineInfo, SpeechInfo
from omnistage.models.omnivoice.config import ARCHITECTURE, MAX_REF_AUDIO_S, PARAM_KEYS, SAMPLE_RATE, VOICES
from omnistage.models.omnivoice.edges import whole_codes
from omnistage.models.shared.speech_family import lm_then_decoder

PIPELINE = lm_then_decoder(
    "omnivoice",
    "OmniVoice: masked-diffusion codes of the whole utterance, then the Higgs Audio v2 tokenizer's decoder (text -> 24 kHz speech)",
    architecture=ARCHITECTURE,
    lm="omnistage.models.omnivoice.engine:build_code_engine",
    lm_name="codes",
    lm_knobs="diffusion",  # num_inference_steps / guidance_scale / seed are the unmasking's
    param_keys=PARAM_KEYS,
    decoder="omnistage.models.omnivoice.decoder:OmniVoiceDecoder",
    decoder_name="decoder",
    decoder_knobs="none",
    whole=whole_codes,
    info=PipelineInfo(
        chat=False,
        speech=SpeechInfo(
            sample_rate=SAMPLE_RATE,
            voices=VOICES,
            default_voice=VOICES[0],
            supports_speed=True,
            supports_voice_cloning=True,
            max_ref_audio_s=MAX_REF_AUDIO_S,
        ),
    ),
)
PIPELINES = [PIPELINE]
TINY: dict = {}  # the tiny folder is committed (tests/models/omnivoice/tiny/): only the package's classes write it

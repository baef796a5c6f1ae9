"""``xtts``: Coqui XTTS v2 (coqui-tts 0.28.0's ``Xtts``) — a GPT over audio codes conditioned on a reference
clip's speaker latents -> the HiFi-GAN decoder (text -> 24 kHz speech in a cloned voice, 17 languages).

Stage 0 ``gpt`` (``ar``, omnistage's step-batched AR engine over transformers' ``GPT2Model`` and the release's
conditioning modules, ``engine.py`` / ``model.py``; why not vLLM: the GPT's inputs are summed per-stream
embeddings after 32 conditioning latents, with no token table vLLM could serve): one audio code and its
latent per step. Stage 1 ``decoder`` (generation): the HiFi-GAN generator over the latents (``codec.py``),
whole or streamed as the release's ``inference_stream`` streams.

- Voice: cloned from ``ref_audio`` (or a voice registered through /v1/audio/voices); its conditioning is
  computed once per clip content (sha256) and cached. ``ref_text`` is not used (XTTS clones from the clip).
- ``language``: one of the checkpoint's ``languages`` (a 400 naming ``language`` otherwise); ``speed``
  stretches the latents (the release's ``length_scale``); ``enable_text_splitting`` (off by default, as in the
  release) speaks the text sentence by sentence (``sentences.py``), the audio of each decoded on its own.
- Params of stage 0: ``temperature`` (0: greedy), ``top_k``, ``top_p``, ``repetition_penalty``,
  ``max_tokens`` (audio codes), ``seed``; defaults from the checkpoint's ``config.json``. Stage 1 takes
  ``chunk_frames`` (codes per streamed piece, the release's ``stream_chunk_size``; default 20).

Tiny fixture: ``python -m omnistage.testing.tiny xtts DIR``.
"""

from __future__ import annotations

from omnistage.info import CodeFrames, PipelineInfo, SpeechInfo
from omnistage.models.shared.speech_family import lm_then_decoder
from omnistage.models.xtts import tiny
from omnistage.models.xtts.config import LANGUAGES, MAX_REF_AUDIO_S, PARAM_KEYS, SAMPLE_RATE, VOICES, is_xtts
from omnistage.models.xtts.edges import latents_in_chunks, whole_latents

PIPELINE = lm_then_decoder(
    "xtts",
    "Coqui XTTS v2: a GPT over audio codes, conditioned on a cloned voice, streams latents to HiFi-GAN "
    "(text -> 24 kHz speech)",
    # coqui's config.json names no architectures ("model": "xtts")
    matches=lambda folder: folder.omnistage_pipeline is None and is_xtts(folder.path),
    lm="omnistage.models.xtts.engine:build_gpt_engine",
    lm_name="gpt",
    param_keys=PARAM_KEYS,
    decoder="omnistage.models.xtts.codec:XttsDecoderAdapter",
    decoder_name="decoder",
    decoder_knobs="none",
    whole=whole_latents,
    chunks=latents_in_chunks,
    info=PipelineInfo(
        chat=False,
        speech=SpeechInfo(
            sample_rate=SAMPLE_RATE,
            voices=VOICES,
            default_voice=VOICES[0],
            supports_voice_cloning=True,
            max_ref_audio_s=MAX_REF_AUDIO_S,
            supports_speed=True,
            languages=LANGUAGES,
            splits_text=True,
            needs_voice=True,  # no preset voice in the weights: every request clones
            # one GPT step: one code and its latent, a frame of the decoder (its samples are not a whole number: the
            # latents are resampled to the vocoder's rate); the GPT takes no min_tokens, it ends at its stop code
            frames=CodeFrames("xtts_hifigan", takes_min_tokens=False),
        ),
    ),
)
PIPELINES = [PIPELINE]
TINY = {"xtts": tiny.build}

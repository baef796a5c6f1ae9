"""``voxtral``: speech in, text out — Voxtral as one decoder-only ``llm`` stage on vLLM.

The stage is vLLM's own ``VoxtralForConditionalGeneration`` (its CPU build runs it), which reads only Mistral's
own layout (``params.json`` with ``multimodal.whisper_model_args``, ``tekken.json``, ``consolidated.safetensors``;
the stage's engine args say so), fed the token prompt prompt.py builds with the folder's tokenizer — the one
vLLM's server builds (``get_generation_prompt``, mistral_common's ``TranscriptionRequest``) — so its text is
token for token vLLM's ``LLM.generate`` and transformers' ``VoxtralForConditionalGeneration.generate`` greedy
on the same weights in transformers' layout (tests/models/voxtral). A request that names no language gets a
prompt without one (the model hears it), as ``vllm serve`` prompts it (``info.transcription.unforced_language``).
Step-level batching across requests is vLLM's, as for any llm stage.

A folder with transformers' layout only (``config.json``) is not this family's: vLLM 0.32 cannot load it.

Tiny fixture: ``voxtral`` (``python -m omnistage.testing.tiny voxtral DIR``; both layouts, the same weights).
"""

from __future__ import annotations

from omnistage.info import PipelineInfo, RecognizerInfo
from omnistage.models.voxtral import tiny
from omnistage.models.voxtral.prompt import ENGINE_ARGS, LANGUAGES, SAMPLE_RATE, WINDOW_S, request_hook
from omnistage.pipeline import ModelFolder, Pipeline, StageSpec


def matches(folder: ModelFolder) -> bool:
    """Mistral's layout of an offline (non-causal encoder) Voxtral; the realtime one is another model."""
    if folder.diffusers_class is not None or folder.omnistage_pipeline is not None:
        return False
    whisper = (folder.mistral_params.get("multimodal") or {}).get("whisper_model_args") or {}
    encoder = whisper.get("encoder_args") or {}
    return bool(encoder) and not encoder.get("causal", False)


VOXTRAL = Pipeline(
    name="voxtral",
    description="Voxtral speech recognition (Whisper encoder + Mistral LM, one llm stage on vLLM, Mistral layout)",
    matches=matches,
    stages=[
        StageSpec(
            0,
            kind="llm",
            name="recognizer",
            output="text+token_ids",
            final=True,
            default_params={"temperature": 0.0},
            deploy_defaults={"engine_args": dict(ENGINE_ARGS)},
        )
    ],
    folder_shape_request=request_hook,
    info=PipelineInfo(
        transcription=RecognizerInfo(
            sample_rate=SAMPLE_RATE,
            window_s=WINDOW_S,
            languages=tuple(LANGUAGES),
            default_language="en",
            unforced_language=True,
        )
    ),
)
PIPELINES = [VOXTRAL]
TINY = {"voxtral": tiny.build}

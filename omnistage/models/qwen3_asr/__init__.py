"""``qwen3_asr``: speech in, text out — Qwen3-ASR as one decoder-only ``llm`` stage on vLLM.

The stage is vLLM's own ``Qwen3ASRForConditionalGeneration`` (its CPU build runs it; it loads
transformers' checkpoint layout as well as the original release's), fed the prompt prompt.py builds —
the one vLLM's server and transformers' ``apply_transcription_request`` write — so its text is token for
token transformers' ``Qwen3ASRForConditionalGeneration.generate`` greedy and vLLM's ``LLM.generate``
(tests/models/qwen3_asr). A request that names no language leaves it to the model, which writes
``language X<asr_text>`` before the transcript; the transcription routes strip that prefix and report the
language it names (``info.transcription.language_prefix``, omnistage.server.transcripts.LanguagePrefix),
as ``vllm serve`` does.

``info.transcription`` tells the transcription routes how to feed it (16 kHz, 30 s windows, its 30
languages, transcription only).

Tiny fixture: ``qwen3_asr`` (``python -m omnistage.testing.tiny qwen3_asr DIR``).
"""

from __future__ import annotations

from omnistage.info import PipelineInfo, RecognizerInfo
from omnistage.models.qwen3_asr import tiny
from omnistage.models.qwen3_asr.prompt import LANGUAGE_PREFIX, LANGUAGES, SAMPLE_RATE, WINDOW_S, to_chat_prompt
from omnistage.pipeline import ModelFolder, Pipeline, StageSpec

ARCHITECTURES = {"Qwen3ASRForConditionalGeneration"}


def matches(folder: ModelFolder) -> bool:
    return folder.is_checkpoint_of(ARCHITECTURES)


QWEN3_ASR = Pipeline(
    name="qwen3_asr",
    description="Qwen3-ASR speech recognition (audio encoder + Qwen3 LM, one llm stage on vLLM)",
    matches=matches,
    stages=[
        StageSpec(
            0, kind="llm", name="recognizer", output="text+token_ids", final=True, default_params={"temperature": 0.0}
        )
    ],
    shape_request=to_chat_prompt,
    info=PipelineInfo(
        transcription=RecognizerInfo(
            sample_rate=SAMPLE_RATE,
            window_s=WINDOW_S,
            languages=tuple(LANGUAGES),
            default_language="en",
            language_prefix=LANGUAGE_PREFIX,
        )
    ),
)
PIPELINES = [QWEN3_ASR]
TINY = {"qwen3_asr": tiny.build}

"""``speech_chat``: speech in, speech out for models that are not omni — recogniser -> chat LLM -> TTS.

Four stages of three families, each reused unchanged; the wiring is this file's edges and request hook
(conversation.py), no orchestrator code:

- stage 0 ``recognizer`` (llm, vLLM's Whisper): the audio part of the last user message, transcribed;
- stage 1 ``chat`` (llm, final, ``text``): the conversation with the transcript in place of the audio
  part, answered by any chat model vLLM serves (its chat template, as the ``chat`` family);
- stage 2 ``speech_lm`` + stage 3 ``codec`` (final, ``audio``): the ``codec_tts`` family's stages
  speaking the reply (streamed: the codec decodes while the speech LM generates, with async chunk on).

Three models, so it is only ever selected by name (``--pipeline speech_chat`` or the deploy file's
``pipeline:``), with each stage's folder in the deploy file::

    pipeline: speech_chat
    stages:
      - {stage_id: 0, model: /models/whisper}
      - {stage_id: 1, model: /models/chat-lm}
      - {stage_id: 2, model: /models/codec-tts}   # a codec_tts folder (omnistage.json + lm/ + codec/)
      - {stage_id: 3, model: /models/codec-tts}

``modalities: ["text"]`` stops after the chat stage; the default gives text and audio. Per-stage knobs go in
``sampling_params_list`` (top-level llm knobs such as ``temperature`` reach every llm stage).
The prompt's ``SpeechInput`` gives the spoken ``language`` (Whisper code, default ``en``) and the ``voice``, one
of the TTS folder's voices. Limits: one audio part of at most 30 s (Whisper's window); the codec stage's
per-request ``chunk_frames`` knobs are not routed (the codec_tts edge reads them as stage 1's params), so
its folder's defaults apply.
"""

from __future__ import annotations

from omnistage.info import PipelineInfo, SpeechInfo
from omnistage.models.shared.codec_lm.stages import codec_stage, speech_lm_stage
from omnistage.models.shared.whisper import recognizer_stage
from omnistage.models.speech_chat.conversation import reply_to_speech, to_recognizer, transcript_into_messages
from omnistage.pipeline import Edge, Pipeline, StageSpec

PIPELINE = Pipeline(
    name="speech_chat",
    description="speech in, speech out: Whisper transcribes, a chat LLM answers, codec_tts speaks the answer",
    matches=None,  # three models: chosen by name, never guessed from a folder
    stages=[
        recognizer_stage(0, output="text", final=False),
        StageSpec(
            1,
            kind="llm",
            name="chat",
            output="text",
            can_output="text+token_ids",
            final=True,
            inputs=[Edge(0, process=transcript_into_messages)],
        ),
        speech_lm_stage(2, inputs=[Edge(1, process=reply_to_speech)]),
        codec_stage(3, source=2),
    ],
    info=PipelineInfo(speech=SpeechInfo()),
    shape_request=to_recognizer,
)
PIPELINES = [PIPELINE]
TINY: dict = {}  # three other families' tiny models (whisper, chat, codec_tts)

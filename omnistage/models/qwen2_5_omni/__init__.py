"""``qwen2_5_omni``: Qwen2.5-Omni — thinker (vLLM) -> talker -> token2wav (DiT + BigVGAN); text and speech.

Stage 0 ``thinker`` (llm, vLLM's own ``Qwen2_5OmniThinkerForConditionalGeneration``): the chat reply as text and
token ids, and for the talker the hidden states of prompt + reply, handed out by its own engine (``thinker.py``).
Stage 1 ``talker``: codec codes on omnistage's step-batched AR engine over transformers' talker
(``talker_engine.py``, ``talker_model.py``). Stage 2 ``token2wav`` (generation): DiT flow sampling + BigVGAN,
24 kHz audio (``token2wav.py``). With async chunk on (the default) the talker starts with the thinker's second token
and steps as its hidden states arrive; token2wav starts when the talker finished (its DiT attends across the whole
code sequence; docs/families/qwen2_5_omni.md says what that costs).

- ``modalities: ["text"]`` runs the thinker only; ``["text", "audio"]`` (default) all three.
- Voices are the speakers of the checkpoint's ``spk_dict.pt`` (``Chelsie``, ``Ethan`` in the release); default
  ``Chelsie`` as in transformers. A request picks one with its ``SpeechInput(voice=...)`` (HTTP: chat
  ``audio.voice``, ``extra_body.speaker``, speech ``voice``) or the talker's ``speaker`` sampling param.
- Per-stage sampling (``sampling_params_list``): vLLM ``SamplingParams`` keys for the thinker and the talker
  (``temperature``, ``top_k``, ``top_p``, ``repetition_penalty``, ``max_tokens`` — the talker's counts codes, as
  ``talker_max_new_tokens`` — ``seed``); token2wav takes ``num_steps``, ``guidance_scale``, ``sway_coefficient``
  and ``seed`` (its initial noise; the request's ``seed`` reaches it).
- A folder without audio output (``enable_audio_output: false``, no talker or no ``spk_dict.pt``) resolves to
  ``qwen2_5_omni_thinker``: the thinker alone, text out.

Tiny fixture: ``python -m omnistage.testing.tiny qwen2_5_omni DIR``.
"""

from __future__ import annotations

from pathlib import Path

from omnistage.models.qwen2_5_omni import tiny
from omnistage.models.qwen2_5_omni.config import ARCHITECTURE, SAMPLE_RATE, TOKEN2WAV_PARAM_KEYS, load_omni25_config
from omnistage.models.qwen2_5_omni.edges import talker_to_token2wav, thinker_to_talker, thinker_to_talker_chunks
from omnistage.models.shared.omni.pipelines import omni_pipelines
from omnistage.pipeline import Edge, StageSpec, lazy


def _voices(folder: Path) -> tuple[str, ...]:
    config = load_omni25_config(folder)
    return tuple(config.voices) if config.enable_audio_output else ()


PIPELINES = omni_pipelines(
    "qwen2_5_omni",
    package="omnistage.models.qwen2_5_omni",
    architecture=ARCHITECTURE,
    description="Qwen2.5-Omni: thinker (vLLM) -> talker -> token2wav (DiT + BigVGAN; text and 24 kHz speech)",
    thinker_description="Qwen2.5-Omni without audio output (enable_audio_output: false, or no talker / spk_dict.pt)",
    speaks=lambda folder: load_omni25_config(folder).enable_audio_output,
    voices=_voices,
    # async chunk (the default): the talker starts with the thinker's second token (edges.py)
    talker_input=Edge(0, process=thinker_to_talker, process_chunk=thinker_to_talker_chunks),
    decoder=StageSpec(
        2,
        kind="generation",
        name="token2wav",
        output="audio",
        final=True,
        adapter=lazy("omnistage.models.qwen2_5_omni.token2wav:Token2WavAdapter"),
        inputs=[Edge(1, process=talker_to_token2wav)],
        param_keys=TOKEN2WAV_PARAM_KEYS,
    ),
    sample_rate=SAMPLE_RATE,
)
QWEN2_5_OMNI, QWEN2_5_OMNI_THINKER = PIPELINES
TINY = {"qwen2_5_omni": tiny.build}

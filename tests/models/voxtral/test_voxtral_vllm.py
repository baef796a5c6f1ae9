"""The ``voxtral`` family on a real vLLM engine (CPU): its token ids and text equal transformers'
``VoxtralForConditionalGeneration.generate`` (greedy, on ``apply_transcription_request``'s inputs, transformers'
layout) and vLLM's own ``LLM.generate`` on the prompt vLLM's server builds (``get_generation_prompt``, Mistral's
layout), on the same tiny weights — offline and through ``/v1/audio/transcriptions`` with the official client;
bad requests are 400s naming the field.
"""

from __future__ import annotations

import pytest
import pytest_asyncio

from omnistage import AsyncOmni
from omnistage.models.voxtral.prompt import ENGINE_ARGS, LANGUAGES
from omnistage.pipeline import resolve_pipeline
from tests.models.asr_cases import (
    CHAT_ASR_ENGINE,
    HEARD_CLIPS,
    RATE,
    check_family_equals_references,
    check_refused_naming,
    request,
    run,
    transformers_greedy,
    vllm_server_prompt_reference,
    wav,
)

pytestmark = [pytest.mark.vllm, pytest.mark.slow, pytest.mark.asyncio(loop_scope="module")]

ENGINE = CHAT_ASR_ENGINE
CLIPS = HEARD_CLIPS
MAX_TOKENS = 16  # (each clip is padded to one 30 s chunk: 375 audio tokens)
LANGUAGE_CASES = ["en", "de", "fr", None]  # None: the prompt names no language
KEYED = {(i, lang): (audio, lang, "") for i, audio in enumerate(CLIPS) for lang in LANGUAGE_CASES}


@pytest.fixture(scope="module")
def folder(tiny_model):
    return tiny_model("voxtral")


@pytest.fixture(scope="module")
def hf_reference(folder):
    """transformers' generate, greedy, on transformers' layout: (clip, language) -> (generated ids, text)."""
    from transformers import VoxtralForConditionalGeneration

    def inputs(proc, audio, language, _):
        return proc.apply_transcription_request(
            audio=audio, model_id=str(folder), language=language, sampling_rate=RATE, format="wav"
        )

    return transformers_greedy(folder, VoxtralForConditionalGeneration, KEYED, inputs, MAX_TOKENS)


@pytest.fixture(scope="module")
def vllm_reference(folder):
    """vLLM's LLM.generate on its server's own transcription prompt: (clip, language) -> (ids, text, prompt ids)."""
    from vllm.model_executor.models.voxtral import VoxtralForConditionalGeneration as VllmVoxtral

    return vllm_server_prompt_reference(folder, VllmVoxtral, KEYED, MAX_TOKENS, **ENGINE, **ENGINE_ARGS)


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def omni(folder, vllm_reference, hf_reference):
    engine = AsyncOmni(folder, **ENGINE)
    await engine.start()
    yield engine
    await engine.shutdown()


async def test_languages_are_the_models():
    from vllm.model_executor.models.voxtral import VoxtralForConditionalGeneration as VllmVoxtral

    assert LANGUAGES == VllmVoxtral.supported_languages


async def test_folder_resolves_to_voxtral(folder):
    assert resolve_pipeline(folder).name == "voxtral"


async def test_references_agree(hf_reference, vllm_reference):
    """vLLM (Mistral's layout) and transformers (its own) agree first, so the two layouts hold the same model
    and a failure below is the family's, not the tiny model's."""
    for key, (ids, text) in hf_reference.items():
        assert vllm_reference[key][:2] == (ids, text), key


async def test_prompt_is_vllm_servers(omni, folder, vllm_reference):
    """The stage's prompt ids are those vLLM's get_generation_prompt writes: the language as ``lang:xx``, none
    when not given, the audio tokens of the padded clip."""
    out, _ = await run(omni, request(CLIPS[1], "de"), max_tokens=1)
    assert out.prompt_token_ids == vllm_reference[1, "de"][2]
    assert vllm_reference[1, "de"][2] != vllm_reference[1, None][2] != vllm_reference[1, "en"][2]


async def test_family_equals_references(omni, vllm_reference, hf_reference):
    requests = {(i, language): request(CLIPS[i], language) for i, language in vllm_reference}
    hf_ids = {key: ids for key, (ids, _) in hf_reference.items()}
    await check_family_equals_references(omni, requests, vllm_reference, hf_ids, MAX_TOKENS)


@pytest.mark.parametrize(
    "prompt, field",
    [
        ({"prompt": "", "transcription": {"language": "en"}}, "multi_modal_data.audio"),
        (request(CLIPS[0], language="xx"), "language"),
        (request(CLIPS[0], language="ja"), "language"),  # a language code, but not Voxtral's
        ({**request(CLIPS[0]), "transcription": {"task": "translate"}}, "task"),
    ],
)
async def test_bad_requests_name_the_field(omni, prompt, field):
    await check_refused_naming(omni, prompt, field, request(CLIPS[0]))


def test_transcriptions_route_equals_references(server_factory, folder, hf_reference, vllm_reference):
    import openai

    srv = server_factory(AsyncOmni(folder, **ENGINE), served_model_name="tiny-voxtral", ready_timeout=300)
    client = openai.OpenAI(base_url=srv.url + "/v1", api_key="none", max_retries=0, timeout=120)
    for language in LANGUAGE_CASES:
        named = {"language": language} if language else {}
        out = client.audio.transcriptions.create(
            model="tiny-voxtral",
            file=("clip.wav", wav(CLIPS[1]), "audio/wav"),
            response_format="verbose_json",
            extra_body={"max_tokens": MAX_TOKENS},
            **named,
        )
        assert len(out.segments) == 1 and out.segments[0].tokens == hf_reference[1, language][0], language
        assert out.text == vllm_reference[1, language][1].strip()
        assert out.language == (language or "en")  # (unnamed: the prompt names none; the default is reported)
        streamed = list(
            client.audio.transcriptions.create(
                model="tiny-voxtral",
                file=("clip.wav", wav(CLIPS[1]), "audio/wav"),
                stream=True,
                extra_body={"max_tokens": MAX_TOKENS},
                **named,
            )
        )
        assert streamed[-1].type == "transcript.text.done"
        assert "".join(e.delta for e in streamed[:-1]) == vllm_reference[1, language][1]
    with pytest.raises(openai.BadRequestError) as e:
        client.audio.transcriptions.create(
            model="tiny-voxtral", file=("clip.wav", wav(CLIPS[0]), "audio/wav"), language="ja"
        )
    assert "language" in str(e.value)
    with pytest.raises(openai.BadRequestError) as e:
        client.audio.translations.create(model="tiny-voxtral", file=("clip.wav", wav(CLIPS[0]), "audio/wav"))
    assert "model" in str(e.value)

"""What the recogniser families' tests share (Whisper, Qwen3-ASR, Voxtral; the transcription routes): the clips,
the request as the routes build it, vLLM's own offline answer on the prompt its server writes, and the checks
that the family's engine equals the references and names a bad field."""

from __future__ import annotations

import asyncio
import io

import numpy as np
import pytest
import soundfile as sf

from omnistage.errors import InvalidRequestError
from omnistage.speech import Transcription
from omnistage.testing.streams import all_outputs
from tests.models.offline_llm import offline_llm

RATE = 16000
# the engine settings of the chat-style recognisers (Qwen3-ASR, Voxtral): prompt and 16 new tokens fit in 512
CHAT_ASR_ENGINE = dict(max_model_len=512, max_num_seqs=8, dtype="float32", enforce_eager=True)


def clip(seconds: float, seed: int, rate: int = RATE) -> np.ndarray:
    """A deterministic tone-and-noise clip (float32 mono)."""
    rng = np.random.default_rng(seed)
    t = np.arange(int(seconds * rate)) / rate
    freq = 220.0 * (1 + seed % 5)
    return (0.3 * np.sin(2 * np.pi * freq * t) + 0.05 * rng.standard_normal(t.size)).astype(np.float32)


def wav(samples: np.ndarray, rate: int = RATE) -> bytes:
    buf = io.BytesIO()
    sf.write(buf, samples, rate, format="WAV", subtype="PCM_16")
    return buf.getvalue()


def as_heard(data: bytes) -> np.ndarray:
    """The samples of a 16 kHz PCM16 WAV as the server decodes them (no resampling at the model's rate)."""
    samples, rate = sf.read(io.BytesIO(data), dtype="float32")
    assert rate == RATE
    return samples


# as a 16-bit WAV holds them (the route tests upload them); the last shorter than Qwen3-ASR's 0.5 s minimum
HEARD_CLIPS = [as_heard(wav(clip(s, seed))) for s, seed in ((2.0, 1), (5.5, 2), (0.3, 3))]


def request(audio, language="en", task="transcribe", previous=""):
    """A recogniser request as the transcription routes build it (omnistage/models/shared/whisper/prompt.py)."""
    return {
        "prompt": previous,
        "multi_modal_data": {"audio": (audio, RATE)},
        "transcription": Transcription(language=language, task=task),
    }


async def run(omni, prompt, **params):
    """One request through the family's engine: (its final output, every delta)."""
    outs = await all_outputs(omni.generate(prompt, sampling_params_list=[params or None]))
    return outs[-1], [o.delta for o in outs]


def transformers_greedy(folder, model_class, cases: dict, inputs, max_tokens: int) -> dict:
    """transformers' ``generate``, greedy, on ``inputs(processor, audio, language, previous text)`` for each case
    ``key -> (audio, language, previous text)``: ``key -> (new token ids, their text)``."""
    import torch
    from transformers import AutoProcessor

    torch.set_num_threads(1)
    proc = AutoProcessor.from_pretrained(folder)
    model = model_class.from_pretrained(folder).eval()
    out = {}
    for key, case in cases.items():
        batch = inputs(proc, *case)
        with torch.no_grad():
            ids = model.generate(**batch, do_sample=False, max_new_tokens=max_tokens)
        new = [int(t) for t in ids[0, batch["input_ids"].shape[1] :]]
        out[key] = (new, proc.tokenizer.decode(new, skip_special_tokens=True))
    return out


def vllm_server_prompt_reference(folder, vllm_class, cases: dict, max_tokens: int, **engine) -> dict:
    """vLLM's offline ``LLM.generate``, greedy, on the prompt its server writes (``get_generation_prompt``) for each
    case ``key -> (audio, language, previous text)``: ``key -> (ids, text, prompt ids)``."""
    from vllm import SamplingParams
    from vllm.config.speech_to_text import SpeechToTextParams

    with offline_llm(folder, **engine) as llm:
        config = llm.llm_engine.model_config
        stt = vllm_class.get_speech_to_text_config(config, "transcribe")
        prompts = [
            vllm_class.get_generation_prompt(
                SpeechToTextParams(audio=a, stt_config=stt, model_config=config, language=lang, request_prompt=prev)
            )
            for a, lang, prev in cases.values()
        ]
        outs = llm.generate(prompts, SamplingParams(temperature=0.0, max_tokens=max_tokens), use_tqdm=False)
        return {
            k: (list(o.outputs[0].token_ids), o.outputs[0].text, list(p["prompt_token_ids"]))
            for k, o, p in zip(cases, outs, prompts)
        }


async def check_family_equals_references(omni, requests: dict, vllm_reference: dict, hf_ids: dict, max_tokens: int):
    """Every request in flight together (continuous batching must not change anyone's output): token ids equal
    vLLM's and transformers', text and the joined deltas vLLM's, and the cases give more than three texts."""
    keys = list(requests)
    results = await asyncio.gather(*(run(omni, requests[k], max_tokens=max_tokens) for k in keys))
    texts = set()
    for key, (out, deltas) in zip(keys, results):
        ref_ids, ref_text = vllm_reference[key][:2]
        assert out.token_ids == ref_ids == hf_ids[key], key
        assert out.text == ref_text
        assert "".join(d.get("text", "") for d in deltas) == ref_text
        texts.add(ref_text)
    assert len(texts) > 3  # the clips, languages and prompts make a difference


async def check_refused_naming(omni, prompt, field: str, good_prompt):
    """A bad request is refused naming ``field``, and the engine keeps serving ``good_prompt``."""
    with pytest.raises(InvalidRequestError) as e:
        await run(omni, prompt, max_tokens=4)
    assert e.value.field == field
    out, _ = await run(omni, good_prompt, max_tokens=2)
    assert out.finished


class TransformersWhisper:
    """The reference for text out of the CLI and of pipelines with a Whisper stage: transformers' Whisper on the
    folder, greedy (the family equals it token for token: tests/models/whisper/test_whisper_vllm.py)."""

    def __init__(self, folder: str):
        import torch
        from transformers import WhisperForConditionalGeneration, WhisperProcessor

        torch.set_num_threads(1)
        self.proc = WhisperProcessor.from_pretrained(folder)
        self.model = WhisperForConditionalGeneration.from_pretrained(folder).eval()

    def features(self, samples):
        return self.proc(samples, sampling_rate=RATE, return_tensors="pt").input_features

    def language(self, samples) -> str:
        import torch

        with torch.no_grad():
            token = int(self.model.detect_language(self.features(samples))[0])
        return self.proc.tokenizer.convert_ids_to_tokens(token)[2:-2]  # <|de|> -> de

    def transcript(self, samples, language: str, max_tokens: int) -> str:
        import torch

        with torch.no_grad():
            ids = self.model.generate(
                self.features(samples), language=language, task="transcribe", do_sample=False, max_new_tokens=max_tokens
            )
        return self.proc.tokenizer.decode(ids[0], skip_special_tokens=True)

"""``LanguagePrefix`` (the transcription routes' stripping of the language a recogniser names before its
transcript, Qwen3-ASR unforced) against ``vllm serve``'s own post-processing of the same text — whole
(``Qwen3ASRForConditionalGeneration.post_process_output``) and streamed at every cut
(``get_streaming_post_processor_cls``) — and the language against transformers' ``Qwen3ASRProcessor.parse_output``."""

from __future__ import annotations

import pytest

from omnistage.models.qwen3_asr.prompt import LANGUAGE_PREFIX, LANGUAGES
from omnistage.server.transcripts import LanguagePrefix

pytestmark = pytest.mark.vllm

TEXTS = [
    "language German<asr_text>speech recognition turns words into text",
    "  language English<asr_text> the quick brown fox",
    "language Cantonese<asr_text>",
    "language None<asr_text>",
    "language Klingon<asr_text>qapla",
    "language English<asr_text>a<asr_text>b",  # the tag twice: the text after the last one
    "the model wrote no prefix at all",
    "lang",  # a prefix's beginning, then the end of the text
    "language English but never the tag",
    "language " + "x" * 60,  # too long to be a prefix
    "language Eng\nlish<asr_text>not a prefix: a line break",
    "",
]


def strip_whole(text: str) -> str:
    return LanguagePrefix(**LANGUAGE_PREFIX).feed(text, finished=True)


def strip_streamed(text: str, cut: int) -> str:
    p = LanguagePrefix(**LANGUAGE_PREFIX)
    return p.feed(text[:cut]) + p.feed(text[cut:]) + p.feed("", finished=True)


@pytest.mark.parametrize("text", TEXTS)
def test_whole_and_streamed_text_are_vllm_serves(text):
    from vllm.model_executor.models.qwen3_asr import Qwen3ASRForConditionalGeneration as VllmQwen3ASR

    want = VllmQwen3ASR.post_process_output(text)
    assert strip_whole(text) == want
    for cut in range(len(text) + 1):
        ref = VllmQwen3ASR.get_streaming_post_processor_cls()()
        deltas = [
            ref.process_delta(text[:cut], False),
            ref.process_delta(text[cut:], False),
            ref.process_delta("", True),
        ]
        assert strip_streamed(text, cut) == "".join(deltas), cut
        p = LanguagePrefix(**LANGUAGE_PREFIX)  # delta by delta, the same pieces as vLLM's at each step
        assert [p.feed(text[:cut]), p.feed(text[cut:]), p.feed("", finished=True)] == deltas, cut


@pytest.mark.parametrize("text", TEXTS)
def test_the_named_language_is_transformers(text):
    from transformers.models.qwen3_asr.processing_qwen3_asr import _parse_single_output

    name = _parse_single_output(text)["language"] if "<asr_text>" in text else None
    code = {v.lower(): k for k, v in LANGUAGES.items()}.get((name or "").lower())
    p = LanguagePrefix(**LANGUAGE_PREFIX)
    p.feed(text, finished=True)
    assert p.language() == code

"""The demo's vocabulary as the server publishes it (omnistage/models/demo/vocabulary.py) is the training set's:
the same words as demo/shapes.py draws and captions, each one token of the shipped tokenizer; words outside it
(what a newcomer tries: "top", "star") fall apart into characters, which is why the server warns about them."""

from __future__ import annotations

from transformers import CLIPTokenizer

from omnistage.info import PipelineInfo
from omnistage.models.demo import WEIGHTS
from omnistage.models.demo.vocabulary import EXAMPLE_PROMPTS, FILLER_WORDS, VOCABULARY
from omnistage.server.prompt_warnings import prompt_warnings


def test_vocabulary_is_the_training_sets(shapes):
    assert VOCABULARY == {
        "shape": list(shapes.SHAPES),
        "colour": list(shapes.COLOURS),
        "position": list(shapes.POSITIONS),
        "size": list(shapes.SIZES),
        "background": list(shapes.BACKGROUNDS),
    }
    trained = set(shapes.vocabulary_words())
    assert {w for words in VOCABULARY.values() for w in words} | set(FILLER_WORDS) >= trained


def test_every_known_word_is_one_token_and_others_are_not():
    tok = CLIPTokenizer.from_pretrained(WEIGHTS / "tokenizer")
    for words in VOCABULARY.values():
        for w in words:
            assert len(tok(w, add_special_tokens=False).input_ids) == 1, w
    for w in ("top", "bottom", "star", "magenta"):
        assert len(tok(w, add_special_tokens=False).input_ids) > 1, w


def test_example_prompts_are_captions_the_training_script_could_write(shapes):
    import numpy as np

    rng = np.random.default_rng(0)
    written = {shapes.caption(shapes.random_scene(rng), rng) for _ in range(20000)}
    for prompt in EXAMPLE_PROMPTS:
        assert prompt in written, prompt
        assert prompt_warnings(PipelineInfo(vocabulary=VOCABULARY, filler_words=FILLER_WORDS), "demo", prompt) == []


def test_words_it_cannot_draw_are_named():
    info = PipelineInfo(vocabulary=VOCABULARY, filler_words=FILLER_WORDS)
    [warning] = prompt_warnings(info, "omnistage-demo", "a yellow Circle at the TOP, with a star")
    assert "'top', 'star'" in warning and "position: left, center, right" in warning
    assert "'circle'" not in warning and "'at'" not in warning
    assert prompt_warnings(PipelineInfo(), "x", "anything at all") == []  # no vocabulary declared: no warnings

"""The demo's vocabulary as the server publishes it (omnistage/models/demo/vocabulary.py) is the training set's:
the same words as demo/shapes.py draws and captions, each one token of the shipped tokenizer; words outside it
(what a newcomer tries: "top", "star") fall apart into characters, which is why the server warns about them."""

from __future__ import annotations

from transformers import CLIPTokenizer

from omnistage.info import PipelineInfo
from omnistage.models.demo import PIPELINE, WEIGHTS
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


def test_training_captions_at_the_training_size_earn_no_warning(shapes):
    import numpy as np

    info = PIPELINE.info
    assert info.trained_sizes == (f"{shapes.SIZE}x{shapes.SIZE}",)
    rng = np.random.default_rng(1)
    for _ in range(2000):
        prompt = shapes.caption(shapes.random_scene(rng), rng)
        assert prompt_warnings(info, "demo", prompt, (shapes.SIZE, shapes.SIZE)) == [], prompt


def test_a_background_named_with_a_shape_colour_and_an_untrained_size_are_named():
    """Known words where another kind's word goes ("yellow background": yellow is a shape colour) and a size the
    demo was not trained at each get their own warning, naming what it can do instead."""
    info = PIPELINE.info
    [warning] = prompt_warnings(info, "omnistage-demo", "a red circle on a Yellow background", (64, 64))
    assert "'yellow background'" in warning and "backgrounds are black, white, gray, brown" in warning
    [warning] = prompt_warnings(info, "omnistage-demo", "a red circle on the left", (256, 256))
    assert "at 256x256" in warning and "Ask for size 64x64" in warning
    words, background, size = prompt_warnings(info, "omnistage-demo", "a large background at the top", (128, 64))
    assert "'top'" in words and "'large background'" in background and "128x64" in size
    assert prompt_warnings(info, "omnistage-demo", "a background", (64, 64)) == []  # a filler word before it
    assert prompt_warnings(PipelineInfo(), "x", "a yellow background", (256, 256)) == []  # nothing declared

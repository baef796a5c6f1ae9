"""XTTS v2's text front end against coqui-tts 0.28.0's own ``VoiceBpeTokenizer`` (the authors' package): per
language, sentences with prices, decimals, thousands, ordinals, abbreviations, symbols, and Chinese, Japanese
and Korean script give the release's cleaned text and token ids (the tiny folder's ``vocab.json``), and text
the release raises on is a 400 naming ``input``; and the release's sentence splitting (``split_sentence`` with its
language's character limit, what ``enable_text_splitting`` speaks) gives the same pieces in English, Spanish,
German, Chinese and Japanese, short texts, texts over the limit and a sentence longer than it.

The goldens (``golden/text_frontend.json``: each sentence, the text ``preprocess_text`` made of it and the ids
``encode`` gave, or the type of what it raised) are written by ``scripts/reference/xtts/text_goldens.py`` in
the reference venv, the pieces (``golden/split.json``) by ``frontend_goldens.py``; regenerate both with
``scripts/reference/xtts/setup.sh`` (which runs them).
"""

from __future__ import annotations

import json

import pytest
from tokenizers import Tokenizer

from omnistage.errors import InvalidRequestError
from omnistage.models.xtts.config import LANGUAGES
from omnistage.models.xtts.sentences import split_text
from omnistage.models.xtts.text import clean, token_ids
from tests.models.xtts.conftest import GOLDEN

ROWS = json.loads((GOLDEN / "text_frontend.json").read_text())
SPLITS = json.loads((GOLDEN / "split.json").read_text())


@pytest.fixture(scope="module")
def tokenizer(xtts_dir):
    return Tokenizer.from_file(str(xtts_dir / "vocab.json"))


def test_the_table_covers_every_language():
    assert {row["language"] for row in ROWS} == set(LANGUAGES)
    assert sum("refused" in row for row in ROWS) >= 2 and sum("ids" in row for row in ROWS) > 40


@pytest.mark.parametrize("row", [r for r in ROWS if "ids" in r], ids=lambda r: f"{r['language']}:{r['text'][:24]}")
def test_text_and_ids_equal_the_release(tokenizer, row):
    assert clean(row["text"], row["language"]) == row["cleaned"]
    assert token_ids(tokenizer, row["text"], row["language"]) == row["ids"]


@pytest.mark.parametrize("row", [r for r in ROWS if "refused" in r], ids=lambda r: f"{r['language']}:{r['refused']}")
def test_what_the_release_refuses_is_a_400_naming_input(tokenizer, row):
    with pytest.raises(InvalidRequestError) as e:
        token_ids(tokenizer, row["text"], row["language"])
    assert e.value.field == "input"


@pytest.mark.parametrize("name", list(SPLITS))
def test_sentence_splitting_equals_the_release(name):
    case = SPLITS[name]
    assert split_text(case["text"], case["language"]) == case["pieces"]


def test_the_split_cases_cut_and_wrap():
    """The table has a text under the limit (one piece), several cut, and a sentence wrapped at the limit."""
    counts = [len(c["pieces"]) for c in SPLITS.values()]
    assert 1 in counts and sum(n > 1 for n in counts) >= 4
    assert len(SPLITS["en_long"]["pieces"][1]) > 240 and not SPLITS["en_long"]["pieces"][1].endswith(".")

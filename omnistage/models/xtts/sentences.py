"""XTTS v2's sentence splitting (the release's ``enable_text_splitting``, off by default): a text of at least
the language's character limit is cut into sentences by spaCy's rule-based sentencizer over that language's
spaCy tokenizer (Chinese, Japanese, Arabic, Spanish and Hindi their own; every other language English's), and
the sentences are packed greedily into pieces of at most the limit: a sentence joins the previous piece (with
a space) while the two fit, a sentence over the limit alone is wrapped at spaces into lines of the limit
(``textwrap``, hyphens not broken), any other sentence starts a new piece. A shorter text is one piece (its
leading whitespace dropped). Each piece is then spoken as a sentence of its own.
"""

from __future__ import annotations

import textwrap
from functools import cache

# The release's characters per sentence, by language (its tokenizer's char_limits): the split's piece size,
# and the length past which an unsplit sentence may be cut short (the release warns, then speaks it).
CHAR_LIMITS = {
    "en": 250,
    "de": 253,
    "fr": 273,
    "es": 239,
    "it": 213,
    "pt": 203,
    "pl": 224,
    "zh": 82,
    "ar": 166,
    "cs": 186,
    "ru": 182,
    "nl": 251,
    "tr": 226,
    "ja": 71,
    "hu": 224,
    "ko": 95,
    "hi": 150,
}
_OWN_TOKENIZER = {"zh": "zh", "ja": "ja", "ar": "ar", "es": "es", "hi": "hi"}  # the rest: English's


def char_limit(language: str) -> int:
    return CHAR_LIMITS.get(language.split("-")[0], 250)


@cache
def _sentencizer(lang: str):
    from spacy.util import get_lang_class  # only for a request that asks to split: spaCy takes a while to load

    nlp = get_lang_class(lang)()
    nlp.add_pipe("sentencizer")
    return nlp


def sentences(text: str, language: str) -> list[str]:
    """``text`` cut as spaCy's sentencizer cuts it in ``language`` (a release language code)."""
    lang = _OWN_TOKENIZER.get(language.split("-")[0], "en")
    return [str(s) for s in _sentencizer(lang)(text).sents]


def split_text(text: str, language: str) -> list[str]:
    """The pieces the release speaks one after another for ``text`` with ``enable_text_splitting``."""
    limit = char_limit(language)
    if len(text) < limit:
        return [text.lstrip()]
    pieces = [""]
    for sentence in sentences(text, language):
        if len(pieces[-1]) + len(sentence) <= limit:
            pieces[-1] = f"{pieces[-1]} {sentence}".lstrip()
        elif len(sentence) > limit:
            pieces += textwrap.wrap(sentence, width=limit, break_on_hyphens=False, tabsize=1)
        else:
            pieces.append(sentence)
    return pieces[1:] if len(pieces) > 1 and not pieces[0] else pieces

"""XTTS v2's text front end: the release's ``VoiceBpeTokenizer`` input (``[lang]`` then the cleaned text with
each space as ``[SPACE]``) through the checkpoint's ``vocab.json`` (a ``tokenizers`` BPE).

Cleaning as the release's ``multilingual_cleaners`` for text of words and punctuation: quotes dropped, lower
case, runs of whitespace as one space. The release also spells out numbers, currencies, abbreviations and
symbols (num2words, per language) and romanises Chinese (pypinyin), Korean and Japanese (cutlet); this front
end does not, so such text is refused (a 400 naming ``input``) rather than spoken differently.
"""

from __future__ import annotations

import re

from omnistage.errors import InvalidRequestError

# what the release rewrites before tokenizing (digits, currencies, abbreviation dots aside): refused here
_REWRITTEN = re.compile(r"[0-9$€£%&@#]")
_ROMANISED = {"zh-cn", "ko", "ja"}


def clean(text: str, language: str) -> str:
    """The text the release tokenizes for ``text`` in ``language`` (a release language code)."""
    if language in _ROMANISED:
        raise InvalidRequestError("language", f"{language!r} text needs the release's romanisation (not served)")
    if _REWRITTEN.search(text):
        raise InvalidRequestError("input", "digits and the symbols $ € £ % & @ # are not spelt out here; write them")
    text = text.strip().lower().replace('"', "")
    if language == "tr":
        text = text.replace("i̇", "i")
    return re.sub(r"\s+", " ", text)


def token_ids(tokenizer, text: str, language: str) -> list[int]:
    """``tokenizer`` (``tokenizers.Tokenizer`` of ``vocab.json``) ids of ``text`` in ``language``."""
    return tokenizer.encode(f"[{language}]{clean(text, language)}".replace(" ", "[SPACE]")).ids

"""The per-language word tables of XTTS v2's text front end: what the release (coqui-tts 0.28.0's
``VoiceBpeTokenizer``) reads abbreviations, symbols and ordinal suffixes as. They are the model's training-time
text convention, so they are kept word for word: a different reading is different speech.
"""

from __future__ import annotations

import re

# abbreviation (a whole word before a dot; Russian's are whole words without one) -> the word said
ABBREVIATIONS: dict[str, tuple[tuple[str, str], ...]] = {
    lang: tuple(tuple(pair.split("=")) for pair in pairs.split("|"))
    for lang, pairs in {
        "en": "mrs=misess|mr=mister|dr=doctor|st=saint|co=company|jr=junior|maj=major|gen=general|drs=doctors"
        "|rev=reverend|lt=lieutenant|hon=honorable|sgt=sergeant|capt=captain|esq=esquire|ltd=limited"
        "|col=colonel|ft=fort",
        "es": "sra=señora|sr=señor|dr=doctor|dra=doctora|st=santo|co=compañía|jr=junior|ltd=limitada",
        "fr": "mme=madame|mr=monsieur|dr=docteur|st=saint|co=compagnie|jr=junior|ltd=limitée",
        "de": "fr=frau|dr=doktor|st=sankt|co=firma|jr=junior",
        "pt": "sra=senhora|sr=senhor|dr=doutor|dra=doutora|st=santo|co=companhia|jr=júnior|ltd=limitada",
        "it": "sig=signore|dr=dottore|st=santo|co=compagnia|jr=junior|ltd=limitata",
        "pl": "p=pani|m=pan|dr=doktor|sw=święty|jr=junior",
        "cs": "dr=doktor|ing=inženýr|p=pan",
        "ru": "г-жа=госпожа|г-н=господин|д-р=доктор",
        "nl": "dhr=de heer|mevr=mevrouw|dr=dokter|jhr=jonkheer",
        "tr": "b=bay|byk=büyük|dr=doktor",
        "hu": "dr=doktor|b=bácsi|nőv=nővér",
    }.items()
}

# the symbols & @ % # $ £ ° in that order -> what each is read as
_SYMBOLS = "&@%#$£°"
SYMBOLS: dict[str, tuple[tuple[str, str], ...]] = {
    lang: tuple(zip(_SYMBOLS, words.split("|"), strict=True))
    for lang, words in {
        "en": "and|at|percent|hash|dollar|pound|degree",
        "es": "y|arroba|por ciento|numeral|dolar|libra|grados",
        "fr": "et|arobase|pour cent|dièse|dollar|livre|degrés",
        "de": "und|at|prozent|raute|dollar|pfund|grad",
        "pt": "e|arroba|por cento|cardinal|dólar|libra|graus",
        "it": "e|chiocciola|per cento|cancelletto|dollaro|sterlina|gradi",
        "pl": "i|małpa|procent|krzyżyk|dolar|funt|stopnie",
        "ar": "و|على|في المئة|رقم|دولار|جنيه|درجة",
        "zh": "和|在|百分之|号|美元|英镑|度",
        "cs": "a|na|procento|křížek|dolar|libra|stupně",
        "ru": "и|собака|процентов|номер|доллар|фунт|градус",
        "nl": "en|bij|procent|hekje|dollar|pond|graden",
        "tr": "ve|at|yüzde|diyez|dolar|sterlin|derece",
        "hu": "és|kukac|százalék|kettőskereszt|dollár|font|fok",
        "ko": "그리고|에|퍼센트|번호|달러|파운드|도",
        "hi": "और|ऐट दी रेट|प्रतिशत|हैश|डॉलर|पाउंड|डिग्री",
    }.items()
}

# a number and the suffix that makes it an ordinal
ORDINAL = {
    lang: re.compile(rf"([0-9]++)({suffix})")  # never a digit after the run: taken whole
    for lang, suffix in {
        "en": "st|nd|rd|th",
        "es": "º|ª|er|o|a|os|as",
        "fr": "º|ª|er|re|e|ème",
        "de": r"st|nd|rd|th|º|ª|\.(?=\s|$)",
        "pt": "º|ª|o|a|os|as",
        "it": "º|°|ª|o|a|i|e",
        "pl": "º|ª|st|nd|rd|th",
        "ar": "ون|ين|ث|ر|ى",
        "ru": "-й|-я|-е|-ое|-ье|-го",
        "nl": "de|ste|e",
        "tr": r"\.|inci|nci|uncu|üncü|\.",
        "hu": r"\.|adik|edik|odik|edik|ödik|ödike|ik",
        "ko": "번째|번|차|째",
        "hi": "st|nd|rd|th",
    }.items()
}
ORDINAL["cs"] = re.compile(r"([0-9]++)\.(?=\s|$)")  # a dot after the number marks an ordinal in Czech

# what num2words puts between the main unit and the cents: cut off when there are no cents
CURRENCY_AND = {"es": " con ", "fr": " et ", "de": " und ", "pt": " e ", "it": " e "}  # elsewhere ", "

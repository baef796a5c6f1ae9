"""Chinese numbers as XTTS v2's release reads them before romanising (its ``zh_num2words.TextNorm()`` with
its defaults): dates, money, phone numbers, fractions, percentages, counted numbers, long digit runs and plain
numbers written in Chinese characters, in that order, then every punctuation mark turned into an ASCII comma.

Kept rule for rule, quirks included (each rewrite replaces the first occurrence of the matched text, wherever
it is; a 4-32 digit run without a measure word is read digit by digit), because the model was trained on text
cleaned this way.
"""

from __future__ import annotations

import re
import string
from operator import itemgetter

DIGITS = "零一二三四五六七八九"
# powers of ten with a name: 十 百 千 万, then 亿 (10^8) and each 10^4 times the last
UNITS = dict(zip((1, 2, 3, 4), "十百千万", strict=True)) | {
    4 * (i + 2): c for i, c in enumerate("亿兆京垓秭穰沟涧正载")
}
LIANG = "两"  # 2 before 百 千 万 …, where 十 is not next to it

_CURRENCY_UNITS = r"((亿|千万|百万|万|千|百)|(亿|千万|百万|万|千|百|)元|(亿|千万|百万|万|千|百|)块|角|毛|分)"
_QUANTIFIERS = (
    "(匹|张|座|回|场|尾|条|个|首|阙|阵|网|炮|顶|丘|棵|只|支|袭|辆|挑|担|颗|壳|窠|曲|墙|群|腔|"
    "砣|座|客|贯|扎|捆|刀|令|打|手|罗|坡|山|岭|江|溪|钟|队|单|双|对|出|口|头|脚|板|跳|枝|件|贴|"
    "针|线|管|名|位|身|堂|课|本|页|家|户|层|丝|毫|厘|分|钱|两|斤|担|铢|石|钧|锱|忽|(千|毫|微)克|"
    "毫|厘|分|寸|尺|丈|里|寻|常|铺|程|(千|分|厘|毫|微)米|撮|勺|合|升|斗|石|盘|碗|碟|叠|桶|笼|盆|"
    "盒|杯|钟|斛|锅|簋|篮|盘|桶|罐|瓶|壶|卮|盏|箩|箱|煲|啖|袋|钵|年|月|日|季|刻|时|周|天|秒|分|旬|"
    "纪|岁|世|更|夜|春|夏|秋|冬|代|伏|辈|丸|泡|粒|颗|幢|堆|条|根|支|道|面|片|张|颗|块)"
)
_CN_PUNCTUATION = (
    "！？｡。＂＃＄％＆＇（）＊＋，－／：；＜＝＞＠［＼］＾＿｀｛｜｝～｟｠｢｣､、〃《》「」『』【】〔〕〖〗〘〙〚〛〜〝〞〟〰〾〿"
    "–—‘’‛“”„‟…‧﹏·〈〉-"
)
_TO_COMMA = str.maketrans(dict.fromkeys(_CN_PUNCTUATION + string.punctuation, ","))

# The release's patterns, with \d++ / \D++ where it has \d+ / \D+: what follows such a run in the pattern can
# never continue it, so taking it whole (possessively) matches the same text, without backtracking over every
# split of a long run (cubic time over a few thousand digits).
_DATE = re.compile(r"\D++((([089]\d|(19|20)\d{2})年)?(\d{1,2}月(\d{1,2}[日号])?)?)")
_MONEY = re.compile(r"\D++((\d++(\.\d++)?)[多余几]?" + _CURRENCY_UNITS + r"(\d" + _CURRENCY_UNITS + r"?)?)")
_MOBILE = re.compile(r"\D((\+?86 ?)?1([38]\d|5[0-35-9]|7[678]|9[89])\d{8})\D")
_LANDLINE = re.compile(r"\D((0(10|2[1-3]|[3-9]\d{2})-?)?[1-9]\d{6,7})\D")
_FRACTION = re.compile(r"(\d++/\d+)")
_PERCENT = re.compile(r"(\d++(\.\d++)?%)")
_COUNTED = re.compile(r"(\d++(\.\d++)?)[多余几]?" + _QUANTIFIERS)
_DIGIT_RUN = re.compile(r"(\d{4,32})")
_NUMBER = re.compile(r"(\d+(\.\d+)?)")
_LATIN_2_LATIN = re.compile(r"(([a-zA-Z]+)二([a-zA-Z]+))")  # P2P, B2B: the 2 comes back
first = itemgetter(0)  # the whole match out of findall's tuple of groups


def _value(digits: str) -> list[tuple[str, int]]:
    """``digits`` (leading zeros allowed) as ("d", digit) / ("u", power) symbols: 1005 is 一千零五."""
    significant = digits.lstrip("0")
    if not significant:
        return []
    if len(significant) == 1:
        zero = [("d", 0)] if len(significant) != len(digits) else []
        return zero + [("d", int(significant))]
    power = max(p for p in UNITS if p < len(significant))
    return _value(digits[:-power]) + [("u", power)] + _value(significant[-power:])


def _spell(symbols: list[tuple[str, int]], liang: bool) -> str:
    out = []
    for i, (kind, v) in enumerate(symbols):
        if kind == "u":
            out.append(UNITS[v])
        elif kind == "p":
            out.append("点")
        elif liang and v == 2 and _liang_here(symbols, i):
            out.append(LIANG)
        else:
            out.append(DIGITS[v])
    return "".join(out)


def _liang_here(symbols: list[tuple[str, int]], i: int) -> bool:
    after = symbols[i + 1] if i + 1 < len(symbols) else None
    before = symbols[i - 1] if i > 0 else None
    if after is None or after[0] != "u" or after[1] == 1:
        return False
    return before is None or (before[0] == "u" and before[1] != 1)


def cardinal(number: str, units: bool = True) -> str:
    """``number`` ("12", "3.05") in characters: with units (十二点零五), or digit by digit (units=False)."""
    whole, _, decimals = number.partition(".")
    if "." in decimals:
        raise ValueError(f"{number!r} has more than one decimal point")
    if units and len(whole) > 1:
        symbols = _value(whole)
    else:
        symbols = [("d", int(c)) for c in whole]
    if decimals:
        symbols += [("p", 0)] + [("d", int(c)) for c in decimals]
    text = _spell(symbols, liang=units)
    if text.startswith("点"):
        return DIGITS[0] + text
    if len(text) >= 2 and text[0] == "一" and text[1] == "十":  # 10-19 are 十, 十一, …, not 一十…
        text = text[1:]
    return text


def digits(number: str) -> str:
    return cardinal(number, units=False)


def _date(date: str) -> str:
    year, sep, rest = date.partition("年")
    if not sep:
        year, rest = "", date
    else:
        year = digits(year) + "年"
    if not rest:
        return year
    month, _, day = rest.partition("月")
    month = cardinal(month) + "月"
    return year + month + (cardinal(day[:-1]) + day[-1] if day else "")


def _money(money: str) -> str:
    for number, _ in _NUMBER.findall(money):
        money = money.replace(number, cardinal(number))
    return money


def _rewrite(text: str, pattern: re.Pattern, group, spell) -> str:
    for match in pattern.findall(text):
        found = group(match)
        text = text.replace(found, spell(found), 1)
    return text


def normalize(text: str) -> str:
    """``text`` with its numbers in characters and its punctuation as commas."""
    text = "^" + text + "$"
    text = _rewrite(text, _DATE, first, _date)
    text = _rewrite(text, _MONEY, first, _money)
    text = _rewrite(text, _MOBILE, first, lambda t: "".join(digits(p) for p in t.strip("+").split()))
    text = _rewrite(text, _LANDLINE, first, lambda t: "".join(digits(p) for p in t.split("-")))
    text = _rewrite(text, _FRACTION, str, lambda f: cardinal(f.split("/")[1]) + "分之" + cardinal(f.split("/")[0]))
    text = _rewrite(text.replace("％", "%"), _PERCENT, first, lambda p: "百分之" + cardinal(p.strip().strip("%")))
    text = _rewrite(text, _COUNTED, first, cardinal)
    text = _rewrite(text, _DIGIT_RUN, str, digits)
    text = _rewrite(text, _NUMBER, first, cardinal)
    for whole, left, right in _LATIN_2_LATIN.findall(text):
        text = text.replace(whole, left + "2" + right, 1)
    return text.lstrip("^").rstrip("$").translate(_TO_COMMA)

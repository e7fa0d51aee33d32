"""The data of the facts block: constants (docs/extensions.md §5.4) and regular expressions (§5.5), exactly as upstream.

Patterns are Python ``re`` on ``str`` with no flags (§5.3): ``\\d``, ``\\w``, ``\\s`` and ``\\b`` are Unicode-aware.
Group numbers used elsewhere refer to these patterns. Patterns that end in a space end in one U+0020.
"""

from __future__ import annotations

import re

HEADER = "Fakty pomocnicze (wyliczone automatycznie, bez oceny prawnej):"

MONTHS = "stycznia lutego marca kwietnia maja czerwca lipca sierpnia września października listopada grudnia".split()
WEEKDAYS = "poniedziałek wtorek środa czwartek piątek sobota niedziela".split()  # index 0 = Monday

MAX_DATES = 6
MAX_DURATIONS = 3
MAX_AMOUNTS = 3
MAX_TOTAL = 12
MAX_COMPARE = 6
MAX_PLAIN = 3
MAX_EURO = 3
MAX_LISTS = 2  # product lists read by C4
MAX_LIST_ITEMS = 5  # items read per product list

# Duration words (singular, plural); the plural is used for every n != 1 (§5.4, §5.13: "5 lata").
DURATION_WORDS = {
    "days": ("dzień", "dni"),
    "weeks": ("tydzień", "tygodnie"),
    "months": ("miesiąc", "miesiące"),
    "years": ("rok", "lata"),
}

QTY_PRE = ("poniżej ", "od ", "do ", "powyżej ", "najmniej ", "min. ", "\u2013", "-")

_MONTH_ALT = "|".join(MONTHS)
_SP = "[ \u00a0]"  # a plain space or a no-break space
_EUR = "(?:euro\\b|EUR\\b|€)"
_PLN = "(?:zł|PLN)\\b"

DATE_TXT = re.compile(rf"\b(\d{{1,2}}) ({_MONTH_ALT}) (\d{{4}})(?: r\.)?")
DATE_NUM = re.compile(r"\b(\d{1,2})\.(\d{1,2})\.(\d{4})\b")
DATE_ISO = re.compile(r"\b(\d{4})-(\d{2})-(\d{2})\b")
DURATION = re.compile(r"\b(\d{1,3}) (dni|dnia|dzień|tygodni|tygodnie|tydzień|miesięcy|miesiące|miesiąc|lat|lata|rok)\b")
DUR_WORD = re.compile(r"\b(tydzień|tygodnia|miesiąc|miesiąca|rok|roku)\b")
AGO = re.compile(r"\b(\d{1,3}) (dni|dzień) temu\b")
TODAY = re.compile(r"\b(?:[Dd]ziś|[Dd]zisiaj)(?: jest| mamy|:)? ")
AMOUNT = re.compile(r"(?<![\d,])\b(\d{1,3}(?: \d{3})+(?:,\d{2})?|\d+(?:,\d{2})?) zł\b")
VAT = re.compile(r"(?<![\d,.])\b(23|8|5) ?%")
VAT_CTX = re.compile(r"\bVAT\b|\bpodat\w* od towarów")
STATED = re.compile(rf"(?<![\d,])\b(\d{{1,3}}(?:{_SP}\d{{3}})+(?:,\d{{2}})?|\d+(?:,\d{{2}})?){_SP}?{_PLN}")
EURO = re.compile(rf"(?<![\d,])\b(\d{{1,3}}(?:{_SP}\d{{3}})*(?:,\d{{1,2}})?){_SP}?{_EUR}")
RATE_ANY = re.compile(rf"(?<![\d,])\b(\d{{1,2}},\d{{2,4}}){_SP}?{_PLN}")
RATE_PER = re.compile(rf"(?<![\d,])\b(\d{{1,2}},\d{{2,4}}){_SP}?{_PLN}{_SP}?(?:za|/){_SP}?(?:1{_SP})?{_EUR}")
RATE_EQ = re.compile(rf"\b1{_SP}?{_EUR}{_SP}?={_SP}?(\d{{1,2}},\d{{2,4}}){_SP}?{_PLN}")
EURO_X_RATE = re.compile(
    rf"(?<![\d,])\b(\d{{1,3}}(?:{_SP}\d{{3}})*(?:,\d{{1,2}})?){_SP}?{_EUR}{_SP}?[×*]{_SP}?(\d{{1,2}},\d{{2,4}}){_SP}?{_PLN}"
)
KURS = re.compile(r"\b[Kk]urs\w*")
BOUND = re.compile(r"[.;!?](?=\s+[A-ZĄĆĘŁŃÓŚŹŻ„\"(])|\n")
LABEL = re.compile(r"[ \u00a0]?\(?(netto|brutto)\b")
BUDGET = re.compile(r"\b[Bb]udżet\w*")
USED = re.compile(r"\b(wykorzystano|wydano|wydatkowano|zużyto|zaangażowano|rozdysponowano)\b")
PRODUCT = re.compile(
    r"(?<![\d,])(?<!\d[ \u00a0])\b(\d{1,4})[ \u00a0]?"
    r"(?:(?:szt\.|sztuk[ia]?|usł\.|godz\.|kg|op\.|opak\.|kpl\.|os\.)[ \u00a0]?)?×[ \u00a0]?(?=\d)"
)
TIER = re.compile(
    r"(?<![\d,])\b(\d{1,3}(?:[ \u00a0]\d{3})*(?:,\d{2})?) zł(?: netto| brutto)?(?: za (?:sztukę|szt\.))?"
    r"(?: przy (?:zamówieniu|zakupie))? (poniżej|do|od|powyżej|co najmniej|min\.) (\d{1,5})"
    r"(?: do (\d{1,5})|[ \u00a0]?[–-][ \u00a0]?(\d{1,5}))? (?:szt\.|sztuk)"
)
QTY = re.compile(r"(?<![\d,])(?<!\d[ \u00a0])\b(\d{1,5})[ \u00a0](?:szt\.|sztuk[ia]?\b)")
FEE = re.compile(
    r"\b(?:[Dd]ostawa|[Ww]ysyłka|[Tt]ransport|[Pp]rzesyłka|[Kk]oszty? (?:dostawy|wysyłki|transportu|przesyłki))\b"
)

"""Digit bounds on JSON numbers that the schema leaves unbounded, so that a model cannot emit a
number that never ends (a small model at temperature 1 writes hundred-digit floats). Same bounds as
llama.cpp's schema grammars: at most 16 integer digits and 16 fraction digits; the exponent at most
2 digits. Any number so bounded is still a number the schema accepts.

The backends build their grammars from JSON Schema, which cannot say "digits"; so the bound is put
into what each backend builds: xgrammar's EBNF (its shared number rules) and outlines-core's own
digit keywords and regex.
A number the schema bounds by range keeps the backend's own range rule (`json_schema` gives every
one-sided range its other side)."""
from __future__ import annotations

INTEGER_DIGITS = 16
FRACTION_DIGITS = 16
EXPONENT_DIGITS = 2
# the largest magnitude with INTEGER_DIGITS digits: the far side given to one-sided ranges
LARGEST = 10 ** INTEGER_DIGITS - 1

_REST = f"[0-9]{{0,{INTEGER_DIGITS - 1}}}"

# xgrammar 0.2's JSON-schema converter emits these shared rules for every unranged integer and
# number (also inside free-form values); tests/test_json_schema_numbers.py pins them.
_XGRAMMAR_RULES = (
    ('basic_integer ::= (("0") | (basic_integer_1 [1-9] [0-9]*))',
     f'basic_integer ::= (("0") | (basic_integer_1 [1-9] {_REST}))'),
    ('basic_number_2 ::= (("0") | ([1-9] [0-9]*))',
     f'basic_number_2 ::= (("0") | ([1-9] {_REST}))'),
    ('basic_number_3 ::= ("" | ("." basic_number_digits{1, -1}))',
     f'basic_number_3 ::= ("" | ("." basic_number_digits{{1, {FRACTION_DIGITS}}}))'),
    ('basic_number_5 ::= ("" | ([eE] basic_number_4 basic_number_digits{1, -1}))',
     f'basic_number_5 ::= ("" | ([eE] basic_number_4 basic_number_digits{{1, {EXPONENT_DIGITS}}}))'),
)

# outlines-core 0.2 takes digit keywords of its own: right for integers and for a number's fraction
# and exponent, wrong for a number's integer part (it would forbid 5), which the regex rewrite below
# bounds instead. Free-form values (json_object, `{}`) stay unbounded there: bounding their numbers
# multiplies the states of outlines-core's generic JSON automaton (14 s to 33 s to build).
OUTLINES_DIGIT_KEYWORDS = {
    "integer": {"maxDigits": INTEGER_DIGITS},
    "number": {"minDigitsFraction": 1, "maxDigitsFraction": FRACTION_DIGITS,
               "minDigitsExponent": 1, "maxDigitsExponent": EXPONENT_DIGITS},
}
_OUTLINES_NUMBER = (
    rf"((-)?(0|[1-9][0-9]*))(\.[0-9]{{1,{FRACTION_DIGITS}}})?([eE][+-][0-9]{{1,{EXPONENT_DIGITS}}})?",
    rf"((-)?(0|[1-9]{_REST}))(\.[0-9]{{1,{FRACTION_DIGITS}}})?([eE][+-][0-9]{{1,{EXPONENT_DIGITS}}})?",
)


class NumberRulesChanged(RuntimeError):
    """The backend no longer emits the number rules this module rewrites (a new backend version)."""


def bound_xgrammar_ebnf(ebnf: str) -> str:
    """xgrammar's EBNF for a JSON schema with every unranged number digit-bounded."""
    lines = ebnf.split("\n")
    for old, new in _XGRAMMAR_RULES:
        try:
            lines[lines.index(old)] = new
        except ValueError:
            raise NumberRulesChanged(f"xgrammar emitted no rule {old.split(' ::=')[0]!r} in the expected form") from None
    return "\n".join(lines)


def bound_outlines_regex(regex: str) -> str:
    """outlines-core's regex for a schema whose numbers carry OUTLINES_DIGIT_KEYWORDS with the
    integer part of those numbers bounded as well."""
    return regex.replace(*_OUTLINES_NUMBER)

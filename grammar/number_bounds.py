"""Digit bounds on JSON numbers that the schema leaves unbounded, so that a model cannot emit a
number that never ends (a small model at temperature 1 writes hundred-digit floats). Same bounds as
llama.cpp's schema grammars: at most 16 integer digits and 16 fraction digits; the exponent at most
2 digits. Any number so bounded is still a number the schema accepts.

The backends build their grammars from JSON Schema, which cannot say "digits"; so the bound is put
into what each backend builds: xgrammar's EBNF (its shared number rules) and outlines-core's regex.
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

# outlines-core 0.2's regexes for a number and an integer (the number first: it contains the other)
_OUTLINES_PATTERNS = (
    (r"((-)?(0|[1-9][0-9]*))(\.[0-9]+)?([eE][+-][0-9]+)?",
     rf"((-)?(0|[1-9]{_REST}))(\.[0-9]{{1,{FRACTION_DIGITS}}})?([eE][+-][0-9]{{1,{EXPONENT_DIGITS}}})?"),
    (r"(-)?(0|[1-9][0-9]*)", rf"(-)?(0|[1-9]{_REST})"),
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
    """outlines-core's regex for a JSON schema with every number digit-bounded."""
    for old, new in _OUTLINES_PATTERNS:
        regex = regex.replace(old, new)
    return regex

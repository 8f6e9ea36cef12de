"""Regex checks shared by the backends: Python's parser finds syntax errors (with a position), and a
walk over its parse tree rejects constructs that the backends would reject late or, worse, quietly
ignore (xgrammar drops a lookahead inside a JSON-schema `pattern`). Plus literal escaping for
`choice` and the newline rule of '.'."""
from __future__ import annotations

import re

try:  # Python 3.11+
    from re import _constants as _sre
    from re import _parser as _sre_parse
except ImportError:  # Python 3.10
    import sre_constants as _sre  # type: ignore[no-redef]
    import sre_parse as _sre_parse  # type: ignore[no-redef]

from radixserve.grammar.spec import GrammarError

_INLINE_FLAGS = re.IGNORECASE | re.MULTILINE | re.DOTALL | re.VERBOSE | re.ASCII
_AT_NAMES = {
    _sre.AT_BOUNDARY: r"word boundary \b", _sre.AT_NON_BOUNDARY: r"non-boundary \B",
    _sre.AT_BEGINNING_STRING: r"anchor \A", _sre.AT_END_STRING: r"anchor \Z",
}
_UNSUPPORTED_OPS = {
    _sre.ASSERT: "lookaround assertion", _sre.ASSERT_NOT: "negative lookaround assertion",
    _sre.GROUPREF: "backreference", _sre.GROUPREF_EXISTS: "conditional group",
}
for _name, _what in (("ATOMIC_GROUP", "atomic group"), ("POSSESSIVE_REPEAT", "possessive quantifier")):
    if hasattr(_sre, _name):
        _UNSUPPORTED_OPS[getattr(_sre, _name)] = _what


def check_regex(pattern: str, where: str = "regex") -> None:
    """Raise GrammarError naming the problem if `pattern` does not compile or uses a construct
    that a token-level automaton cannot enforce."""
    try:
        parsed = _sre_parse.parse(pattern)
    except re.error as e:
        raise GrammarError(f"{where}: {e.msg} at position {e.pos}") from None
    if parsed.state.flags & _INLINE_FLAGS:
        raise GrammarError(f"{where}: inline flags such as (?i) are not supported")
    _walk(parsed, where, top_level=True)


def _walk(sub, where: str, top_level: bool) -> None:
    items = list(sub)
    for i, (op, av) in enumerate(items):
        if op in _UNSUPPORTED_OPS:
            raise GrammarError(f"{where}: {_UNSUPPORTED_OPS[op]} is not supported")
        if op == _sre.AT:
            if av in _AT_NAMES:
                raise GrammarError(f"{where}: {_AT_NAMES[av]} is not supported")
            # The whole output is matched, so '^' and '$' only make sense at the two ends.
            at_edge = top_level and ((av == _sre.AT_BEGINNING and i == 0)
                                     or (av == _sre.AT_END and i == len(items) - 1))
            if not at_edge:
                raise GrammarError(f"{where}: anchors '^' and '$' are only supported at the start and end")
        elif op == _sre.SUBPATTERN:
            _group, add_flags, del_flags, body = av
            if add_flags or del_flags:
                raise GrammarError(f"{where}: inline flags such as (?i) are not supported")
            _walk(body, where, top_level=False)
        elif op in (_sre.MAX_REPEAT, _sre.MIN_REPEAT):
            _walk(av[2], where, top_level=False)
        elif op == _sre.BRANCH:
            # a top-level alternation like ^a$|^b$ keeps its anchors at the ends of each branch
            for branch in av[1]:
                _walk(branch, where, top_level=top_level and len(items) == 1)


_META = set("\\.^$|?*+()[]{}")


def escape_literal(text: str) -> str:
    """A regex that matches exactly `text`, written so that both xgrammar's and Rust's regex
    syntax read it the same way (only metacharacters escaped, control characters as \\xNN)."""
    out = []
    for ch in text:
        if ch in _META:
            out.append("\\" + ch)
        elif ord(ch) < 0x20 or ord(ch) == 0x7F:
            out.append(f"\\x{ord(ch):02x}")
        else:
            out.append(ch)
    return "".join(out)


def dot_excludes_newline(pattern: str) -> str:
    """Each '.' becomes [^\\n]: Python and Rust regexes do not let '.' match a newline, xgrammar's does."""
    return _rewrite_outside_classes(pattern, {".": r"[^\n]"})


def strip_anchors(pattern: str) -> str:
    """Drop '^' and '$' (outlines-core matches the whole output anyway and refuses anchors).
    Only valid after `check_regex`, which allows anchors at the ends alone."""
    return _rewrite_outside_classes(pattern, {"^": "", "$": ""})


def _rewrite_outside_classes(pattern: str, replacements: dict[str, str]) -> str:
    """Replace single unescaped characters that stand outside any [...] class."""
    out, i, in_class = [], 0, False
    while i < len(pattern):
        ch = pattern[i]
        if ch == "\\":
            out.append(pattern[i:i + 2])
            i += 2
            continue
        if in_class:
            # ']' right after '[' or '[^' is a literal member, not the end of the class
            if ch == "]" and not (out and out[-1] in ("[", "[^")):
                in_class = False
        elif ch == "[":
            in_class = True
            if pattern.startswith("[^", i):
                out.append("[^")
                i += 2
                continue
        elif ch in replacements:
            ch = replacements[ch]
        out.append(ch)
        i += 1
    return "".join(out)

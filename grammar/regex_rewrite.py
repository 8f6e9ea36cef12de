"""JSON-schema `pattern`s rewritten into the one form both backends read the same way: anchored at
both ends, '.' spelled [^\\n], and, when the schema also bounds the length, the length folded into
the pattern's repetitions (a backend given both keeps the pattern and drops the lengths).

A pattern is parsed by Python's own regex parser (jsonschema, the reference, matches with `re`),
turned into a small tree and printed back. A JSON Schema pattern is a search; an alternative with no
anchor is generated as if anchored, which only ever narrows what is produced."""
from __future__ import annotations

import re
from dataclasses import dataclass, field, replace
from typing import Optional, Union

try:  # Python 3.11+
    from re import _constants as _sre
    from re import _parser as _sre_parse
except ImportError:  # Python 3.10
    import sre_constants as _sre  # type: ignore[no-redef]
    import sre_parse as _sre_parse  # type: ignore[no-redef]


class RegexRefused(ValueError):
    """A pattern this module cannot express for the backends; the message says why."""


@dataclass(frozen=True)
class Atom:
    """One character-matching item, already printed (a literal, a class, a category)."""
    text: str


@dataclass(frozen=True)
class Anchor:
    start: bool


@dataclass(frozen=True)
class Seq:
    items: tuple["Node", ...]


@dataclass(frozen=True)
class Alt:
    branches: tuple["Node", ...]


@dataclass(frozen=True)
class Group:
    body: "Node"


@dataclass(frozen=True)
class Repeat:
    body: "Node"
    lo: int
    hi: Optional[int]  # None: unbounded


Node = Union[Atom, Anchor, Seq, Alt, Group, Repeat]


@dataclass(frozen=True)
class RewrittenPattern:
    text: str
    exact: bool            # the same strings as the original search pattern with the lengths
    notes: tuple[str, ...] = field(default=())


_CATEGORIES = {
    _sre.CATEGORY_DIGIT: r"\d", _sre.CATEGORY_NOT_DIGIT: r"\D", _sre.CATEGORY_SPACE: r"\s",
    _sre.CATEGORY_NOT_SPACE: r"\S", _sre.CATEGORY_WORD: r"\w", _sre.CATEGORY_NOT_WORD: r"\W",
}
_META = set("\\.^$|?*+()[]{}")
_CLASS_META = set("\\]^-[")


def _char(code: int, in_class: bool) -> str:
    ch = chr(code)
    if code < 0x20 or code == 0x7F:
        return f"\\x{code:02x}"
    if ch in (_CLASS_META if in_class else _META):
        return "\\" + ch
    return ch


def _class(items) -> str:
    out = []
    for op, av in items:
        if op == _sre.NEGATE:
            out.insert(0, "^")
        elif op == _sre.LITERAL:
            out.append(_char(av, True))
        elif op == _sre.RANGE:
            out.append(f"{_char(av[0], True)}-{_char(av[1], True)}")
        elif op == _sre.CATEGORY and av in _CATEGORIES:
            out.append(_CATEGORIES[av])
        else:
            raise RegexRefused(f"character class item {op} is not supported")
    return "[" + "".join(out) + "]"


def _from_sre(sub) -> Node:
    items: list[Node] = []
    for op, av in sub:
        if op == _sre.LITERAL:
            items.append(Atom(_char(av, False)))
        elif op == _sre.NOT_LITERAL:
            items.append(Atom(f"[^{_char(av, True)}]"))
        elif op == _sre.ANY:
            # Python's '.' (jsonschema's) stops at a newline; xgrammar's would not
            items.append(Atom(r"[^\n]"))
        elif op == _sre.IN:
            items.append(Atom(_class(av)))
        elif op == _sre.BRANCH:
            items.append(Alt(tuple(_from_sre(b) for b in av[1])))
        elif op == _sre.SUBPATTERN:
            _group, add_flags, del_flags, body = av
            if add_flags or del_flags:
                raise RegexRefused("inline flags such as (?i) are not supported")
            items.append(Group(_from_sre(body)))
        elif op in (_sre.MAX_REPEAT, _sre.MIN_REPEAT):  # laziness does not change what matches
            lo, hi, body = av
            items.append(Repeat(_from_sre(body), lo, None if hi == _sre.MAXREPEAT else hi))
        elif op == _sre.AT and av in (_sre.AT_BEGINNING, _sre.AT_END):
            items.append(Anchor(av == _sre.AT_BEGINNING))
        elif op == _sre.AT:
            raise RegexRefused(r"word boundaries and \A \Z anchors are not supported")
        elif op in (_sre.ASSERT, _sre.ASSERT_NOT):
            raise RegexRefused("lookaround assertions are not supported")
        elif op in (_sre.GROUPREF, _sre.GROUPREF_EXISTS):
            raise RegexRefused("backreferences are not supported")
        else:
            raise RegexRefused(f"the regex construct {op} is not supported")
    return items[0] if len(items) == 1 else Seq(tuple(items))


def parse(pattern: str) -> Node:
    try:
        parsed = _sre_parse.parse(pattern)
    except re.error as e:
        raise RegexRefused(f"{e.msg} at position {e.pos}") from None
    if parsed.state.flags & (re.IGNORECASE | re.MULTILINE | re.DOTALL | re.VERBOSE):
        raise RegexRefused("inline flags such as (?i) are not supported")
    return _from_sre(parsed)


def to_text(node: Node) -> str:
    if isinstance(node, Atom):
        return node.text
    if isinstance(node, Anchor):
        return "^" if node.start else "$"
    if isinstance(node, Seq):
        return "".join(to_text(i) for i in node.items)
    if isinstance(node, Alt):
        return "(?:" + "|".join(to_text(b) for b in node.branches) + ")"
    if isinstance(node, Group):
        return "(" + to_text(node.body) + ")"
    body = to_text(node.body)
    if not isinstance(node.body, (Atom, Group, Alt)):
        body = f"(?:{body})"
    lo, hi = node.lo, node.hi
    if (lo, hi) == (0, None):
        return body + "*"
    if (lo, hi) == (1, None):
        return body + "+"
    if (lo, hi) == (0, 1):
        return body + "?"
    if hi is None:
        return f"{body}{{{lo},}}"
    return f"{body}{{{lo}}}" if lo == hi else f"{body}{{{lo},{hi}}}"


# ---- anchors -------------------------------------------------------------------------------
def _strip(node: Node, start: bool) -> tuple[Node, bool]:
    """`node` without the anchor on its `start` (or end) side on every path; and whether every
    path had one."""
    if isinstance(node, Anchor) and node.start == start:
        return Seq(()), True
    if isinstance(node, Seq) and node.items:
        i = 0 if start else len(node.items) - 1
        first, anchored = _strip(node.items[i], start)
        items = list(node.items)
        items[i] = first
        return Seq(tuple(x for x in items if x != Seq(()))), anchored
    if isinstance(node, (Alt, Group)):
        parts = [_strip(b, start) for b in (node.branches if isinstance(node, Alt) else (node.body,))]
        anchored = all(a for _, a in parts)
        if isinstance(node, Group):
            return Group(parts[0][0]), anchored
        return Alt(tuple(p for p, _ in parts)), anchored
    return node, False


def _has_anchor(node: Node) -> bool:
    if isinstance(node, Anchor):
        return True
    if isinstance(node, Seq):
        return any(_has_anchor(i) for i in node.items)
    if isinstance(node, Alt):
        return any(_has_anchor(b) for b in node.branches)
    return isinstance(node, (Group, Repeat)) and _has_anchor(node.body)


# ---- lengths -------------------------------------------------------------------------------
def width(node: Node) -> tuple[int, Optional[int]]:
    """Fewest and most characters `node` matches (None: no bound)."""
    if isinstance(node, Atom):
        return 1, 1
    if isinstance(node, Anchor):
        return 0, 0
    if isinstance(node, Group):
        return width(node.body)
    if isinstance(node, Seq):
        lo, hi = 0, 0
        for item in node.items:
            a, b = width(item)
            lo += a
            hi = None if hi is None or b is None else hi + b
        return lo, hi
    if isinstance(node, Alt):
        widths = [width(b) for b in node.branches]
        his = [b for _, b in widths]
        return min(a for a, _ in widths), None if None in his else max(his)
    a, b = width(node.body)
    if b == 0:
        return 0, 0
    return a * node.lo, None if node.hi is None or b is None else b * node.hi


def _cap(node: Node, cap: int) -> Node:
    """Every repetition allowed at most max(its minimum, cap) times."""
    if isinstance(node, Seq):
        return Seq(tuple(_cap(i, cap) for i in node.items))
    if isinstance(node, Alt):
        return Alt(tuple(_cap(b, cap) for b in node.branches))
    if isinstance(node, Group):
        return Group(_cap(node.body, cap))
    if isinstance(node, Repeat):
        hi = max(node.lo, cap) if node.hi is None else min(node.hi, max(node.lo, cap))
        return Repeat(_cap(node.body, cap), node.lo, hi)
    return node


def _raise_minimum(node: Node, deficit: int) -> tuple[Node, int]:
    """Make the mandatory repetitions of `node` (those on its top-level sequence) repeat more
    often until it matches at least `deficit` more characters; returns what is still missing."""
    if deficit <= 0:
        return node, 0
    if isinstance(node, Group):
        body, deficit = _raise_minimum(node.body, deficit)
        return Group(body), deficit
    if isinstance(node, Seq):
        items = list(node.items)
        for i, item in enumerate(items):
            items[i], deficit = _raise_minimum(item, deficit)
        return Seq(tuple(items)), deficit
    if isinstance(node, Repeat):
        lo_w, hi_w = width(node.body)
        if lo_w == hi_w and lo_w > 0:
            more = -(-deficit // lo_w)
            if node.hi is not None:
                more = min(more, node.hi - node.lo)
            return replace(node, lo=node.lo + more), max(0, deficit - more * lo_w)
    return node, deficit


def _bound(node: Node, min_len: int, max_len: Optional[int]) -> Optional[Node]:
    """A narrowing of `node` whose every match has a length in [min_len, max_len], or None."""
    if isinstance(node, Alt) or (isinstance(node, Group) and isinstance(node.body, Alt)):
        branches = node.branches if isinstance(node, Alt) else node.body.branches
        kept = [b for b in (_bound(b, min_len, max_len) for b in branches) if b is not None]
        return Alt(tuple(kept)) if kept else None
    lo, hi = width(node)
    if lo < min_len:
        node, missing = _raise_minimum(node, min_len - lo)
        if missing:
            return None
    if max_len is not None:
        lo, hi = width(node)
        if hi is None or hi > max_len:
            if width(_cap(node, 0))[1] > max_len:
                return None
            low, high = 0, max_len  # the largest cap that still fits
            while low < high:
                mid = (low + high + 1) // 2
                if width(_cap(node, mid))[1] <= max_len:
                    low = mid
                else:
                    high = mid - 1
            node = _cap(node, low)
    lo, hi = width(node)
    ok = lo >= min_len and (max_len is None or (hi is not None and hi <= max_len))
    return node if ok else None


def rewrite_pattern(pattern: str, min_length: int = 0, max_length: Optional[int] = None) -> RewrittenPattern:
    """`pattern` anchored at both ends, with `min_length`/`max_length` folded in where they are
    not already implied. Raises RegexRefused when that cannot be done."""
    node = parse(pattern)
    notes: list[str] = []
    node, anchored_start = _strip(node, start=True)
    node, anchored_end = _strip(node, start=False)
    if _has_anchor(node):
        raise RegexRefused("anchors '^' and '$' are supported only at the start and end of an alternative")
    exact = anchored_start and anchored_end
    if not exact:
        notes.append("generated as a whole-string match (the pattern is a search)")
    lo, hi = width(node)
    implied = lo >= min_length and (max_length is None or (hi is not None and hi <= max_length))
    if not implied:
        bounded = _bound(node, min_length, max_length)
        if bounded is None and not exact:
            # the whole-string reading leaves no room for the lengths: the search reading
            # (anything before an unanchored start, after an unanchored end) may
            pad = Repeat(Atom(r"[\s\S]"), 0, None)
            searched = Seq(((pad,) if not anchored_start else ()) + (Group(node),) + ((pad,) if not anchored_end else ()))
            bounded = _bound(searched, min_length, max_length)
        if bounded is None:
            raise RegexRefused(f"cannot fold minLength {min_length} / maxLength {max_length} into the pattern")
        node = bounded
        exact = False
        notes.append("minLength/maxLength folded into the pattern's repetitions")
    return RewrittenPattern(f"^{to_text(node)}$", exact, tuple(notes))

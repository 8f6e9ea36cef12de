"""Structured output: grammar specs, backends (xgrammar, outlines-core) behind one interface,
the off-thread compiler with its cache, and per-request matchers that fill bitmask rows.

Backends are imported on demand: importing this package (the runtime's tokenizer does, for
VocabInfo) does not load xgrammar or outlines-core.
"""
from __future__ import annotations

from radixserve.grammar.backend import GrammarBackend, GrammarMatcher
from radixserve.grammar.compiler import CompileHandle, GrammarCompiler
from radixserve.grammar.json_schema import NormalisedSchema, normalise_json_schema
from radixserve.grammar.schema_support import SchemaRefusal
from radixserve.grammar.spec import GRAMMAR_KINDS, GrammarError, GrammarSpec, StructuralTag, StructuralTagSpec
from radixserve.grammar.vocab import VocabInfo, VocabType

GRAMMAR_BACKENDS = ("xgrammar", "outlines-core")


def make_grammar_backend(name: str, vocab: VocabInfo, any_whitespace: bool = False) -> GrammarBackend:
    """The backend called `name` ("xgrammar" or "outlines-core") over `vocab`. JSON comes out
    compact (no whitespace between tokens) unless `any_whitespace`."""
    if name == "xgrammar":
        from radixserve.grammar.xgrammar_backend import XGrammarBackend
        return XGrammarBackend(vocab, any_whitespace=any_whitespace)
    if name == "outlines-core":
        from radixserve.grammar.outlines_backend import OutlinesCoreBackend
        return OutlinesCoreBackend(vocab, any_whitespace=any_whitespace)
    raise ValueError(f"unknown grammar backend {name!r} (choose from: {', '.join(GRAMMAR_BACKENDS)})")


__all__ = [
    "GRAMMAR_BACKENDS", "GRAMMAR_KINDS", "CompileHandle", "GrammarBackend", "GrammarCompiler",
    "GrammarError", "GrammarMatcher", "GrammarSpec", "NormalisedSchema", "SchemaRefusal", "StructuralTag",
    "StructuralTagSpec", "VocabInfo", "VocabType", "make_grammar_backend", "normalise_json_schema",
]

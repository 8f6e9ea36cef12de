"""VocabInfo built from the runtime's tokenizer, token byte decoding, and GrammarSpec keys."""
from __future__ import annotations

import pytest

from radixserve.grammar import GrammarError, GrammarSpec, VocabInfo, VocabType
from radixserve.grammar.regex_check import dot_excludes_newline, escape_literal, strip_anchors
from radixserve.grammar.vocab import decode_token


def test_default_tokenizer_vocab_info_describes_the_model(default_model_files, default_tokenizer):
    vocab = default_tokenizer.vocab_info(default_model_files.config.vocab_size)
    assert vocab.vocab_type is VocabType.BYTE_LEVEL
    assert vocab.model_vocab_size == default_model_files.config.vocab_size == 49152
    assert set(default_model_files.config.eos_token_ids) <= set(vocab.stop_token_ids)
    assert vocab.bitmask_width == 49152 // 32
    im_start = default_tokenizer.encode("<|im_start|>", add_special_tokens=False)[0]
    assert im_start in vocab.special_token_ids and vocab.token_bytes[im_start] is None
    space_the = default_tokenizer.encode(" the", add_special_tokens=False)
    assert len(space_the) == 1 and vocab.token_bytes[space_the[0]] == b" the"


def test_padding_ids_have_no_text():
    vocab = VocabInfo(tokens=("a", "b", "</s>"), vocab_type="raw", stop_token_ids=(2,), model_vocab_size=40)
    assert vocab.token_bytes[:3] == (b"a", b"b", None)
    assert vocab.token_bytes[3:] == (None,) * 37
    assert vocab.bitmask_width == 2
    assert 5 in vocab.non_text_token_ids and 2 not in vocab.non_text_token_ids


def test_vocab_info_requires_a_stop_token_inside_the_model_vocab():
    with pytest.raises(ValueError, match="stop token"):
        VocabInfo(tokens=("a",), vocab_type="raw", stop_token_ids=(), model_vocab_size=1)
    with pytest.raises(ValueError, match="outside the model vocab"):
        VocabInfo(tokens=("a",), vocab_type="raw", stop_token_ids=(7,), model_vocab_size=2)


@pytest.mark.parametrize("text,vocab_type,expected", [
    ("Ġhello", VocabType.BYTE_LEVEL, b" hello"),
    ("Ċ", VocabType.BYTE_LEVEL, b"\n"),
    ("Ã©", VocabType.BYTE_LEVEL, "é".encode()),
    ("▁hi", VocabType.BYTE_FALLBACK, b" hi"),
    ("<0x0A>", VocabType.BYTE_FALLBACK, b"\n"),
    ("<0xE4>", VocabType.BYTE_FALLBACK, b"\xe4"),
    ("plain text", VocabType.RAW, b"plain text"),
])
def test_token_strings_decode_to_their_bytes(text, vocab_type, expected):
    assert decode_token(text, vocab_type) == expected


def test_equal_schemas_in_another_key_order_share_a_key():
    a = GrammarSpec.json_schema({"type": "object", "properties": {"x": {"type": "integer"}}})
    b = GrammarSpec.json_schema('{"properties": {"x": {"type": "integer"}}, "type": "object"}')
    assert a == b and hash(a) == hash(b) and a.key[0] == "json_schema"
    assert GrammarSpec.regex("a+") != GrammarSpec.ebnf("a+")


def test_unknown_kind_is_a_named_error():
    with pytest.raises(GrammarError, match="unknown grammar kind 'yaml'"):
        GrammarSpec("yaml", "x")


def test_regex_literal_escaping_and_rewrites():
    assert escape_literal('a.b(c)\n"') == 'a\\.b\\(c\\)\\x0a"'
    assert dot_excludes_newline(r"a.\.[.]") == r"a[^\n]\.[.]"
    assert strip_anchors(r"^a[$^]\$$") == r"a[$^]\$"

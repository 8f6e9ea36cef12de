"""Incremental detokenization with the default model's tokenizer."""
from radixserve.runtime.detokenizer import IncrementalDetokenizer


def stream(tokenizer, text, stop=()):
    ids = tokenizer.encode(text, add_special_tokens=False)
    d = IncrementalDetokenizer(tokenizer, [], list(stop), skip_special_tokens=True)
    chunks = []
    for t in ids:
        d.add_token(t)
        chunks.append(d.pop_delta())
        if d.stopped:
            break
    chunks.append(d.pop_delta(final=True))
    return chunks, d


def test_concatenated_deltas_equal_full_decode(default_tokenizer):
    text = "Grüße aus Köln — 東京 🌍 and plain ASCII."
    chunks, _ = stream(default_tokenizer, text)
    assert "".join(chunks) == text
    assert all("\ufffd" not in c for c in chunks)


def test_stop_string_is_cut_and_not_emitted(default_tokenizer):
    chunks, d = stream(default_tokenizer, "alpha beta gamma delta", stop=["gam"])
    assert d.stopped
    assert "".join(chunks) == "alpha beta "


def test_text_that_might_start_a_stop_string_is_held_back(default_tokenizer):
    ids = default_tokenizer.encode("The end of the", add_special_tokens=False)
    d = IncrementalDetokenizer(default_tokenizer, [], ["the story"], skip_special_tokens=True)
    out = ""
    for t in ids:
        d.add_token(t)
        out += d.pop_delta()
    assert not out.endswith("the")           # " the" could begin "the story"
    assert out + d.pop_delta(final=True) == "The end of the"

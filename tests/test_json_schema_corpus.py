"""The corpus of real-world-shaped schemas (tests/schemas/corpus.json, written by
tests/schemas/make_corpus.py): every one compiles with the default backend, or is refused by the
keyword the corpus names; then a handful are generated for, and every finished output validates
against its original schema. Cheap by design: the figures over the whole corpus (acceptance,
validity at the default temperature, compile times) come from bench/json_schemas.py."""
from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import pytest

from radixserve.grammar import GrammarError, GrammarSpec, make_grammar_backend
from radixserve.grammar.json_schema import validator_class
from radixserve.runtime.sampling_params import SamplingParams

CORPUS = json.loads((Path(__file__).parent / "schemas" / "corpus.json").read_text())
BY_NAME = {e["name"]: e for e in CORPUS}
GENERATED = ["functions/get_weather", "functions/sentiment", "functions/lookup_order", "k8s/ConfigMap"]


@pytest.fixture(scope="module")
def backend(default_model_files, default_tokenizer):
    return make_grammar_backend("xgrammar", default_tokenizer.vocab_info(default_model_files.config.vocab_size))


def test_corpus_covers_the_five_families_with_over_a_hundred_schemas():
    families = {e["family"] for e in CORPUS}
    assert families == {"kubernetes", "ci", "openapi", "azure", "functions"}
    assert len(CORPUS) >= 100


@pytest.mark.parametrize("name", list(BY_NAME))
def test_corpus_schema_compiles_or_is_refused_by_its_keyword(backend, name):
    entry = BY_NAME[name]
    refused = entry.get("refuse")
    if refused is None:
        backend.compile(GrammarSpec.json_schema(entry["schema"]))
        return
    with pytest.raises(GrammarError) as info:
        backend.compile(GrammarSpec.json_schema(entry["schema"]))
    assert getattr(info.value, "keyword", None) == refused, str(info.value)


def test_a_handful_of_corpus_schemas_generate_valid_json(make_engine, default_tokenizer):
    engine = make_engine()
    prompts, params = [], []
    for name in GENERATED:
        schema = BY_NAME[name]["schema"]
        prompts.append(default_tokenizer.apply_chat_template([{"role": "user", "content":
                       f"Write one example {name.split('/')[1]} as JSON."}]))
        params.append(SamplingParams(max_tokens=48, temperature=0.0, constraint=GrammarSpec.json_schema(schema)))
    results = engine.generate(prompts, params)
    finished = 0
    for name, result in zip(GENERATED, results):
        assert result.finish_reason in ("stop", "length"), (name, result.finish_reason)
        if result.finish_reason == "stop":
            schema = BY_NAME[name]["schema"]
            assert validator_class(schema)(schema).is_valid(json.loads(result.text)), (name, result.text)
            finished += 1
        else:
            assert "\n" not in result.text and "  " not in result.text  # compact JSON
    assert finished >= 1  # so that the check above is not vacuous


def test_jsonschema_reads_every_corpus_schema():
    # the corpus itself is valid JSON Schema under each schema's own draft
    for entry in CORPUS:
        validator_class(entry["schema"]).check_schema(entry["schema"])
    assert jsonschema is not None

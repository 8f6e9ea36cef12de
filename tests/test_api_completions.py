"""/v1/completions: text and token-id prompts, several prompts, streaming, logprobs and echo."""
from __future__ import annotations

import httpx

PROMPT = "The capital of France is"


def complete(api, **kw):
    kw.setdefault("max_tokens", 6)
    kw.setdefault("prompt", PROMPT)
    return api.client().completions.create(model=api.model, temperature=0, **kw)


def test_completion_continues_the_prompt_in_openai_shape(api):
    r = complete(api)
    assert r.object == "text_completion" and r.id.startswith("cmpl-") and r.model == api.model
    [choice] = r.choices
    assert choice.index == 0 and choice.text and choice.finish_reason in ("stop", "length")
    prompt_tokens = httpx.post(api.url + "/tokenize", json={"prompt": PROMPT}).json()["count"]
    assert r.usage.prompt_tokens == prompt_tokens
    assert r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens


def test_token_id_prompt_gives_the_same_text_as_its_string(api):
    ids = httpx.post(api.url + "/tokenize", json={"prompt": PROMPT}).json()["tokens"]
    assert complete(api, prompt=ids).choices[0].text == complete(api).choices[0].text


def test_several_prompts_give_choices_in_prompt_order(api):
    r = complete(api, prompt=[PROMPT, "Once upon a time"], n=2, max_tokens=3)
    assert [c.index for c in r.choices] == [0, 1, 2, 3]
    assert r.choices[0].text == r.choices[1].text  # greedy, same prompt
    single = [httpx.post(api.url + "/tokenize", json={"prompt": p}).json()["count"]
              for p in (PROMPT, "Once upon a time")]
    assert r.usage.prompt_tokens == sum(single)  # each prompt counted once, not once per choice


def test_streamed_completion_concatenates_to_the_whole_one(api):
    whole = complete(api, max_tokens=10).choices[0]
    chunks = list(complete(api, max_tokens=10, stream=True))
    assert "".join(c.choices[0].text for c in chunks) == whole.text
    assert chunks[-1].choices[0].finish_reason == whole.finish_reason


def test_logprobs_count_gives_that_many_alternatives(api):
    r = complete(api, logprobs=2)
    lp = r.choices[0].logprobs
    assert "".join(lp.tokens) == r.choices[0].text
    assert len(lp.token_logprobs) == len(lp.tokens) == r.usage.completion_tokens
    assert all(len(top) == 2 for top in lp.top_logprobs)
    assert lp.text_offset[0] == 0 and lp.text_offset == sorted(lp.text_offset)


def test_echo_prepends_the_prompt(api):
    plain = complete(api).choices[0].text
    assert complete(api, echo=True).choices[0].text == PROMPT + plain


def test_stop_token_ids_and_ignore_eos_extras_are_accepted(api):
    r = complete(api, max_tokens=5, extra_body={"ignore_eos": True, "min_tokens": 5, "top_k": 5, "min_p": 0.1,
                                                 "repetition_penalty": 1.1, "stop_token_ids": [2],
                                                 "priority": 1})
    assert r.usage.completion_tokens == 5 and r.choices[0].finish_reason == "length"

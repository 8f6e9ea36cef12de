"""GET /v1/cache (what the prefix cache holds, for the page's cache view), and how the page itself
is served: at `/` without a key, off with `--no-ui`."""
import httpx
import pytest

from radixserve.api.server import build_app
from .api_server import serve_app

# Long enough to fill several pages, and a word that would show if prompt text leaked.
SYSTEM = "You are Zebulon the archivist of the cache view tests. " * 8


def ask(api, url, question: str) -> None:
    httpx.post(url + "/v1/chat/completions", timeout=120, json={
        "model": api.model, "max_tokens": 2, "temperature": 0,
        "messages": [{"role": "system", "content": SYSTEM}, {"role": "user", "content": question}]}
    ).raise_for_status()


@pytest.fixture
def view(api):
    def get(url: str = api.url, **params) -> dict:
        r = httpx.get(url + "/v1/cache", params=params, timeout=30)
        r.raise_for_status()
        return r.json()
    return get


def test_pages_by_owner_add_up_to_the_pool(api, view):
    ask(api, api.url, "One?")
    api.wait_idle()
    pages = view()["kv_pages"]
    assert pages["used"] + pages["cached"] + pages["free"] == api.engine.pool.num_pages
    assert pages["cached"] > 0 and pages["used"] == 0


def test_a_reused_prefix_is_listed_with_its_hits(api, view):
    ask(api, api.url, "Two?")
    ask(api, api.url, "Three?")
    api.wait_idle()
    body = view(limit=100)
    system_tokens = len(api.engine.tokenizer.encode(SYSTEM))
    reused = [p for p in body["prefixes"] if p["hits"] >= 1 and p["tokens"] >= system_tokens]
    assert reused, body["prefixes"]
    assert body["prefix_cache"]["hit_tokens"] > 0
    assert 0 < body["prefix_cache"]["hit_ratio"] <= 1


def test_prefixes_are_listed_longest_first_up_to_the_limit(api, view):
    ask(api, api.url, "Four?")
    api.wait_idle()
    prefixes = view(limit=3)["prefixes"]
    assert 0 < len(prefixes) <= 3
    assert [p["tokens"] for p in prefixes] == sorted((p["tokens"] for p in prefixes), reverse=True)


def test_prompt_text_is_never_shown_by_default(api, view):
    ask(api, api.url, "Five?")
    api.wait_idle()
    r = httpx.get(api.url + "/v1/cache", params={"limit": 100}, timeout=30)
    assert r.json()["prefix_text"] is False
    assert "Zebulon" not in r.text and all("text" not in p or p["text"] is None for p in r.json()["prefixes"])


def test_prompt_text_is_shown_when_the_server_allows_it(api, view):
    with serve_app(build_app(api.engine, served_model_name=api.model, ui_show_prefix_text=True)) as url:
        ask(api, url, "Six?")
        api.wait_idle()
        body = view(url, limit=100)
    assert body["prefix_text"] is True
    assert any("Zebulon" in (p["text"] or "") for p in body["prefixes"])


def test_a_limit_out_of_range_is_a_400_in_openai_format(api):
    r = httpx.get(api.url + "/v1/cache", params={"limit": 1000}, timeout=30)
    assert r.status_code == 400
    assert r.json()["error"]["param"] == "limit"


def test_the_page_and_its_files_need_no_api_key_but_the_cache_view_does(api):
    with serve_app(build_app(api.engine, served_model_name=api.model, api_key="s3cret")) as url:
        page = httpx.get(url + "/", timeout=30)
        script = httpx.get(url + "/ui/app.js", timeout=30)
        refused = httpx.get(url + "/v1/cache", timeout=30)
        allowed = httpx.get(url + "/v1/cache", headers={"Authorization": "Bearer s3cret"}, timeout=30)
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    assert script.status_code == 200 and "javascript" in script.headers["content-type"]
    assert "s3cret" not in page.text + script.text
    assert refused.status_code == 401 and refused.json()["error"]["code"] == "invalid_api_key"
    assert allowed.status_code == 200


def test_the_page_forbids_outside_origins(api):
    csp = httpx.get(api.url + "/", timeout=30).headers["content-security-policy"]
    directives = dict(d.strip().split(" ", 1) for d in csp.split(";"))
    assert directives["default-src"] == "'self'" and directives["connect-src"] == "'self'"
    assert "unsafe" not in csp


def test_no_ui_serves_no_page():
    app = build_app(None, ui=False)
    with serve_app(app) as url:
        r = httpx.get(url + "/", timeout=30)
        asset = httpx.get(url + "/ui/app.js", timeout=30)
    assert r.status_code == 404 and "error" in r.json()
    assert asset.status_code == 404


def test_by_hits_the_most_reused_prefix_comes_first(api, view):
    for question in ("Seven?", "Eight?", "Nine?"):
        ask(api, api.url, question)
    api.wait_idle()
    prefixes = view(limit=5, order="hits")["prefixes"]
    assert [p["hits"] for p in prefixes] == sorted((p["hits"] for p in prefixes), reverse=True)
    assert prefixes[0]["hits"] >= 2


def test_each_prefix_is_named_by_its_page_hash(api, view):
    ask(api, api.url, "Ten?")
    api.wait_idle()
    hashes = [p["hash"] for p in view(limit=20)["prefixes"]]
    assert all(len(h) == 16 and int(h, 16) >= 0 for h in hashes) and len(set(hashes)) == len(hashes)

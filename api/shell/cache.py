"""`GET /v1/cache`: what the prefix cache holds now, for the web page's cache view and for people
who would rather read JSON than /metrics: the KV pool by owner, the requests running and waiting,
the hit ratio so far, and the longest (or most reused) cached prefixes with how often each was
reused and their page hash, and the disk tier's size and traffic. Prompt text
is private: prefixes are shown as token counts unless the server was started with
`--ui-show-prefix-text`. `DELETE /v1/cache` drops every cached prefix no request is using, or one
tenant's (`?cache_salt=`)."""
from __future__ import annotations

import asyncio
from typing import Literal, Optional

from fastapi import APIRouter, Depends, Query
from pydantic import BaseModel, Field

from radixserve.api.errors import allow_only, refusal_error
from radixserve.api.state import ServerState, server_state
from radixserve.runtime.engine_client import EngineRefusal
from radixserve.runtime.sampling_params import MAX_CACHE_SALT

DEFAULT_PREFIXES = 10
MAX_PREFIXES = 100
MAX_PREFIX_TEXT = 2000   # characters of a prefix's text shown (its end: where prefixes differ)

router = APIRouter()


class KVPages(BaseModel):
    used: int = Field(description="held by running requests outside the tree")
    cached: int = Field(description="owned by the radix tree")
    free: int
    usage: float = Field(description="share of the pool held by requests or the tree")


class RequestCounts(BaseModel):
    running: int
    waiting: int


class PrefixCacheTotals(BaseModel):
    queried_tokens: int = Field(description="prompt tokens looked up in the cache since start-up")
    hit_tokens: int = Field(description="of those, served from the cache")
    hit_ratio: float
    evicted_tokens: int = Field(description="cached tokens dropped from memory to make room")
    disk_hit_tokens: int = Field(description="of the hits, read back from the disk tier")


class DiskTierView(BaseModel):
    pages: int = Field(description="KV pages in --cache-dir")
    bytes: int
    max_bytes: int = Field(description="--cache-dir-size")
    bytes_written: int
    bytes_read: int
    corrupt_files: int = Field(description="page files dropped as short, torn or failing their checksum")
    dropped_writes: int = Field(description="pages not written: the queue was full, or the disk full of retained pages")


class CachedPrefixView(BaseModel):
    tokens: int
    hash: str = Field(description="hex of the prefix's chained page hash (per tenant where a cache_salt was sent)")
    hits: int = Field(description="requests that reused at least this whole prefix")
    in_use: bool = Field(description="a running request holds it")
    text: Optional[str] = Field(default=None, description="its last characters; only with --ui-show-prefix-text")


class CacheView(BaseModel):
    object: str = "cache"
    kv_pages: KVPages
    requests: RequestCounts
    prefix_cache: PrefixCacheTotals
    disk: Optional[DiskTierView] = Field(description="the disk tier below the tree (null without --cache-dir)")
    prefixes: list[CachedPrefixView] = Field(description="the top cached prefixes by `order`, first the most "
                                                         "(none with --replicas: each replica has its own tree)")
    prefix_text: bool = Field(description="whether prefixes carry their text")


class CacheFlush(BaseModel):
    object: str = "cache.flush"
    dropped_tokens: int = Field(description="cached tokens dropped; prefixes running requests read stay")


@router.delete("/v1/cache", response_model=CacheFlush)
async def flush_cache(cache_salt: Optional[str] = Query(
                          default=None, min_length=1, max_length=MAX_CACHE_SALT,
                          description="drop only this tenant's prefixes (default: every prefix)"),
                      state: ServerState = Depends(server_state)) -> CacheFlush:
    engine = state.require_engine()
    try:
        dropped = await asyncio.to_thread(engine.drop_prefixes, cache_salt, cache_salt is None)
    except EngineRefusal as refusal:
        raise refusal_error(refusal) from None
    return CacheFlush(dropped_tokens=dropped)


allow_only(router, "/v1/cache", ["GET", "DELETE"])


@router.get("/v1/cache", response_model=CacheView)
async def cache_view(limit: int = Query(default=DEFAULT_PREFIXES, ge=0, le=MAX_PREFIXES),
                     order: Literal["tokens", "hits"] = Query(
                         default="tokens", description="the longest prefixes, or those reused by the most requests"),
                     state: ServerState = Depends(server_state)) -> CacheView:
    engine = state.require_engine()
    show_text = state.show_prefix_text

    def read() -> list[CachedPrefixView]:
        views = []
        for p in engine.cached_prefixes(limit, order, with_tokens=show_text):
            text = None
            if show_text:
                text = engine.tokenizer.decode(p.token_ids, skip_special_tokens=False)[-MAX_PREFIX_TEXT:]
            views.append(CachedPrefixView(tokens=p.tokens, hash=f"{p.hash:016x}", hits=p.hits, in_use=p.in_use,
                                          text=text))
        return views

    prefixes = await asyncio.to_thread(read) if limit else []
    s = engine.stats()
    return CacheView(
        kv_pages=KVPages(used=s.kv_pages_used, cached=s.kv_pages_cached, free=s.kv_pages_free,
                         usage=s.kv_cache_usage),
        requests=RequestCounts(running=s.num_running, waiting=s.num_waiting),
        prefix_cache=PrefixCacheTotals(
            queried_tokens=s.prefix_cache_queried_tokens, hit_tokens=s.prefix_cache_hit_tokens,
            hit_ratio=s.prefix_cache_hit_tokens / s.prefix_cache_queried_tokens if s.prefix_cache_queried_tokens else 0.0,
            evicted_tokens=s.evicted_tokens, disk_hit_tokens=s.prefix_cache_disk_hit_tokens),
        disk=None if (d := s.cache_dir) is None else DiskTierView(
            pages=d.files, bytes=d.bytes, max_bytes=s.cache_dir_max_bytes, bytes_written=d.bytes_written,
            bytes_read=d.bytes_read, corrupt_files=d.corrupt_dropped, dropped_writes=d.writes_dropped),
        prefixes=prefixes, prefix_text=show_text)

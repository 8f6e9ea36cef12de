"""Finished Responses kept by id (`store: true`), so that `previous_response_id` can continue a
conversation and `GET /v1/responses/{id}` can return it. In memory, bounded, least recently used
first out: an evicted id is answered like an unknown one (404).

Besides the response body, each entry keeps what the next turn needs to hit the radix cache: the
exact token ids the engine saw (prompt + output) and the text they stand for. Re-tokenising the
rendered conversation would not always give the same ids for the model's own output, and a
different id at any position ends the prefix the tree can reuse.
"""
from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, Optional

from radixserve.api.errors import APIError
from radixserve.api.openai.protocol import ChatMessage

DEFAULT_RESPONSE_STORE_SIZE = 1024


@dataclass(frozen=True)
class StoredResponse:
    body: dict[str, Any]              # the response object as it was returned
    messages: list[ChatMessage]       # the conversation so far, output included, instructions not
    text: str                         # the prompt text of the last turn followed by its raw output
    token_ids: list[int]              # the ids the engine computed for `text` (prompt + output)


class ResponseStore:
    """LRU map of response id to StoredResponse; `capacity` 0 keeps nothing."""

    def __init__(self, capacity: int = DEFAULT_RESPONSE_STORE_SIZE):
        if capacity < 0:
            raise ValueError("response-store-size must be >= 0")
        self.capacity = capacity
        self._items: OrderedDict[str, StoredResponse] = OrderedDict()

    def __len__(self) -> int:
        return len(self._items)

    def put(self, response_id: str, item: StoredResponse) -> None:
        if self.capacity == 0:
            return
        self._items[response_id] = item
        self._items.move_to_end(response_id)
        while len(self._items) > self.capacity:
            self._items.popitem(last=False)

    def get(self, response_id: str, param: Optional[str] = None) -> StoredResponse:
        """The stored response (now the most recently used), or a 404 naming `param`."""
        item = self._items.get(response_id)
        if item is None:
            raise not_found(response_id, param)
        self._items.move_to_end(response_id)
        return item

    def delete(self, response_id: str) -> None:
        if self._items.pop(response_id, None) is None:
            raise not_found(response_id, None)


def not_found(response_id: str, param: Optional[str]) -> APIError:
    return APIError(404, f"Response with id {response_id!r} not found: it was never stored (store: false), "
                         "was deleted, or was evicted from this server's response store", param=param,
                    code="response_not_found", error_type="invalid_request_error")

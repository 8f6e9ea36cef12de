"""Waiting-queue order. A policy only orders; admission limits live in the scheduler."""
from __future__ import annotations

from typing import Protocol, Sequence

from runtime.request import Request

LPM_MAX_QUEUE = 128  # beyond this, matching every waiting request costs more than it buys


class SchedulePolicy(Protocol):
    def order(self, waiting: Sequence[Request], tree) -> list[Request]:
        ...


class FCFSPolicy:
    def order(self, waiting: Sequence[Request], tree) -> list[Request]:
        return list(waiting)


class LongestPrefixPolicy:
    """Longest cached prefix first (ties keep arrival order); FCFS for long queues."""

    def order(self, waiting: Sequence[Request], tree) -> list[Request]:
        if len(waiting) > LPM_MAX_QUEUE or tree is None:
            return list(waiting)
        cached = {id(r): len(tree.match_prefix(r.token_ids[:-1])[0]) for r in waiting}
        return sorted(waiting, key=lambda r: -cached[id(r)])


def make_policy(name: str) -> SchedulePolicy:
    return {"fcfs": FCFSPolicy, "lpm": LongestPrefixPolicy}[name]()

"""A real headless Chromium for the page's tests, driven by Playwright for Python.

Playwright's own browser download cannot be reached here, so Playwright is pointed at the system's
Chromium (`make setup` installs Debian's `chromium` package): $RADIXSERVE_CHROMIUM if set, else the
first of chromium, chromium-browser, google-chrome on PATH. Not finding one is a failure, not a skip.
"""
from __future__ import annotations

import os
import shutil
from dataclasses import dataclass, field

# Chromium's background services would call Google's hosts, which this machine refuses; none is
# needed to render a page. The sandbox needs user namespaces, which CI containers (root) lack.
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
                 "--disable-sync", "--disable-quic", "--no-first-run", "--disable-default-apps"]


def chromium_path() -> str:
    path = os.environ.get("RADIXSERVE_CHROMIUM") or next(
        filter(None, map(shutil.which, ("chromium", "chromium-browser", "google-chrome"))), None)
    if not path:
        raise RuntimeError("no Chromium found: install it (`apt-get install chromium`; `make setup` does) or set "
                           "RADIXSERVE_CHROMIUM to its executable")
    return path


@dataclass
class PageLog:
    """What a page did that a test may check: console errors, uncaught exceptions, and every URL it
    requested (to prove nothing came from outside the server)."""
    errors: list[str] = field(default_factory=list)
    requests: list[str] = field(default_factory=list)
    bodies: dict[str, list[dict]] = field(default_factory=dict)   # path -> JSON bodies POSTed there

    def watch(self, page) -> None:
        page.on("console", lambda m: self.errors.append(f"console.{m.type}: {m.text}") if m.type == "error" else None)
        page.on("pageerror", lambda e: self.errors.append(f"uncaught: {e}"))
        page.on("request", self._request)

    def _request(self, request) -> None:
        self.requests.append(request.url)
        if request.method == "POST" and request.post_data:
            self.bodies.setdefault(request.url.split("//", 1)[1].split("/", 1)[1], []).append(request.post_data_json)

"""The HTTP client under ``OpenAIChatRunner``: the SDK's own, except that a timeout is final.

The ``openai`` SDK retries failed connections, 429s and 5xx with backoff,
and that is what SPEC §9 asks for; it also retries timeouts, which a runner
must not do: the server may still be generating (and billing) the abandoned
completion, and each retry would hold the worker slot for another whole
timeout. The SDK passes its own exceptions through its retry loop untouched,
so raising ``APITimeoutError`` here, where the transport times out, ends the
call at the first timeout.

Imported only when a runner is built: ``openai`` is slow to import.
"""

from __future__ import annotations

from typing import Any

import httpx2
import openai


class TimeoutsNotRetried(openai.DefaultHttpxClient):
    """The SDK's default HTTP client (its pool limits, redirects and timeout)."""

    def send(self, request: httpx2.Request, **kwargs: Any) -> httpx2.Response:
        try:
            return super().send(request, **kwargs)
        except httpx2.TimeoutException as exc:
            raise openai.APITimeoutError(request=request) from exc

"""What a browser carries between requests: a CSRF token and a one-shot notice.

Both live in cookies signed with a per-server secret, so the server keeps no
session table and a cookie planted by another site (or a sibling subdomain)
fails the signature. CSRF is the double-submit pattern: every form carries
the token of the ``HttpOnly``, ``SameSite=Strict`` cookie in a hidden field,
and a POST whose field and cookie are not the same signed token is refused.
A forged cross-site form can make the browser send the cookie (were
``SameSite`` absent) but cannot read it to fill in the field. A script of
the JSON API asks ``GET /api/session`` for the same kind of token and sends
it back in the ``X-CSRF-Token`` header: no other site can read that answer,
so a header carrying this server's signature came from someone who could.

The notice is how a POST tells the page it redirects to what happened
(post/redirect/get): "Cancellation requested", or the refusal the client
raised. It is read once and cleared.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import secrets
import time
from dataclasses import dataclass
from typing import Literal

from starlette.requests import Request
from starlette.responses import Response

CSRF_COOKIE = "cd_csrf"
CSRF_FIELD = "csrf_token"
CSRF_HEADER = "X-CSRF-Token"
NOTICE_COOKIE = "cd_notice"
NOTICE_MAX_AGE = 120
"""Seconds a notice stays readable: long enough for a redirect, too short to resurface later."""
NOTICE_MAX_CHARS = 1500
"""Keeps the signed cookie well under the 4 KB browsers accept."""

NoticeKind = Literal["ok", "error"]


@dataclass(frozen=True, slots=True)
class Notice:
    kind: NoticeKind
    text: str


class Signer:
    """HMAC-SHA256 signatures over short strings: ``value.signature``."""

    def __init__(self, secret: bytes) -> None:
        self._secret = secret

    def _mac(self, value: str) -> str:
        digest = hmac.new(self._secret, value.encode(), hashlib.sha256).digest()
        return base64.urlsafe_b64encode(digest).rstrip(b"=").decode()

    def sign(self, value: str) -> str:
        return f"{value}.{self._mac(value)}"

    def unsign(self, token: str | None) -> str | None:
        if not token:
            return None
        value, _, mac = token.rpartition(".")
        if not value or not hmac.compare_digest(mac.encode(), self._mac(value).encode()):
            return None
        return value


class BrowserSession:
    """Issues and checks CSRF tokens, and carries notices across a redirect."""

    def __init__(self, secret: bytes | None = None) -> None:
        # A fresh secret per server: tokens from before a restart stop working,
        # and a reload of the page issues a new one. A key per purpose, so a
        # notice cookie (signed too) can never pass for a CSRF token.
        root = secret or secrets.token_bytes(32)
        self._csrf = Signer(hmac.new(root, b"csrf", hashlib.sha256).digest())
        self._notices = Signer(hmac.new(root, b"notice", hashlib.sha256).digest())

    def csrf_token(self, request: Request) -> str:
        """The request's valid token, or a new one that ``persist`` will set."""
        current = request.cookies.get(CSRF_COOKIE)
        if current is not None and self._csrf.unsign(current) is not None:
            return current
        issued: str | None = getattr(request.state, "csrf_issued", None)
        if issued is None:
            issued = self._csrf.sign(secrets.token_urlsafe(24))
            request.state.csrf_issued = issued
        return issued

    def csrf_valid(self, request: Request, submitted: str | None) -> bool:
        cookie = request.cookies.get(CSRF_COOKIE)
        if not cookie or not submitted or self._csrf.unsign(cookie) is None:
            return False
        return hmac.compare_digest(cookie.encode(), submitted.encode())

    def csrf_signed(self, token: str | None) -> bool:
        """Whether ``token`` is one this server issued: the API's header needs no cookie beside it."""
        return self._csrf.unsign(token) is not None

    def notice(self, request: Request) -> Notice | None:
        """The notice left by the previous response, if still fresh; ``persist`` clears it."""
        raw = self._notices.unsign(request.cookies.get(NOTICE_COOKIE))
        if raw is None:
            return None
        request.state.notice_read = True
        try:
            data = json.loads(base64.urlsafe_b64decode(raw + "=" * (-len(raw) % 4)))
            kind, text, at = data["kind"], data["text"], float(data["at"])
        except (ValueError, KeyError, TypeError):
            return None
        if kind not in ("ok", "error") or not isinstance(text, str) or time.time() - at > NOTICE_MAX_AGE:
            return None
        return Notice(kind, text)

    def leave_notice(self, response: Response, kind: NoticeKind, text: str) -> None:
        if len(text) > NOTICE_MAX_CHARS:
            text = text[: NOTICE_MAX_CHARS - 1] + "…"
        payload = json.dumps({"kind": kind, "text": text, "at": time.time()})
        # Unpadded base64: no '=' or quotes, so the cookie value needs no quoting.
        value = self._notices.sign(base64.urlsafe_b64encode(payload.encode()).decode().rstrip("="))
        response.set_cookie(NOTICE_COOKIE, value, max_age=NOTICE_MAX_AGE, httponly=True, samesite="strict")

    def persist(self, request: Request, response: Response) -> None:
        """Set the CSRF cookie issued while rendering, and drop a notice that was shown."""
        issued: str | None = getattr(request.state, "csrf_issued", None)
        if issued is not None:
            response.set_cookie(
                CSRF_COOKIE, issued, httponly=True, samesite="strict", secure=request.url.scheme == "https"
            )
        if getattr(request.state, "notice_read", False):
            response.delete_cookie(NOTICE_COOKIE, httponly=True, samesite="strict")

"""Headers on every response that keep the dashboard's pages from being framed or made to run
anything but its own files: Content-Security-Policy (only this origin's scripts, styles, images
and form targets; no plugins; ``frame-ancestors 'none'``), X-Frame-Options for older browsers,
no MIME sniffing, and no Referer to other sites (URLs name private repositories).

A plain ASGI middleware: it only adds headers to ``http.response.start``, never touches a body,
so the webhook's streaming limit reads the request as it arrives.
"""

from __future__ import annotations

CONTENT_SECURITY_POLICY = (
    "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; "
    "object-src 'none'; base-uri 'none'; form-action 'self'; frame-ancestors 'none'"
)
# FastAPI's interactive API pages load their script and styles from a CDN; they are still unframeable.
DOCS_PATHS = ("/docs", "/redoc")
DOCS_POLICY = "frame-ancestors 'none'; object-src 'none'; base-uri 'none'"

HEADERS = [
    (b"x-frame-options", b"DENY"),
    (b"x-content-type-options", b"nosniff"),
    (b"referrer-policy", b"same-origin"),
]


class SecurityHeaders:
    def __init__(self, app) -> None:
        self.app = app

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        policy = DOCS_POLICY if scope.get("path", "").startswith(DOCS_PATHS) else CONTENT_SECURITY_POLICY

        async def send_with_headers(message):
            if message["type"] == "http.response.start":
                present = {name.lower() for name, _ in message.get("headers", [])}
                extra = [(b"content-security-policy", policy.encode()), *HEADERS]
                message = {**message, "headers": [*message.get("headers", []),
                                                   *((n, v) for n, v in extra if n not in present)]}
            await send(message)

        await self.app(scope, receive, send_with_headers)

"""Send the HTTP requests whose path starts with given prefixes to their own ASGI handler."""

from __future__ import annotations

from typing import Any


def by_prefix(prefixes: str | tuple[str, ...], handler: Any, app: Any) -> Any:
    """An ASGI app: HTTP requests whose path starts with ``prefixes`` go to ``handler``,
    everything else (other paths, websockets, lifespan) to ``app``."""

    async def router(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "http" and scope["path"].startswith(prefixes):
            await handler(scope, receive, send)
        else:
            await app(scope, receive, send)

    return router

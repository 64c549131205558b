"""Websocket routes (the live dashboard consumer lands with the dashboard work)."""

websocket_urlpatterns: list = []

"""Websocket routes (included by claw_site/asgi.py behind the session auth stack)."""

from django.urls import path

from .consumers import LiveConsumer

websocket_urlpatterns: list = [path("ws/live/", LiveConsumer.as_asgi())]

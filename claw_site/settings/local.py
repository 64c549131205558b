"""Developer machine and `make run`: embedded defaults. Debug pages are off (they show
settings and every route to whoever asks); DJANGO_DEBUG=1 turns them on. Static files are
served either way (claw_site/asgi.py: ASGIStaticFilesHandler)."""

from .base import *  # noqa: F403
from .base import env_bool

DEBUG = env_bool("DJANGO_DEBUG", False)

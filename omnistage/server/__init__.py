"""OpenAI-compatible HTTP server: ``create_app(engine, settings)``."""

from omnistage.server.app import create_app
from omnistage.server.options import ServeOptions

__all__ = ["ServeOptions", "create_app"]

"""One router per API surface: system (health, models, metrics), chat, images, audio, videos."""

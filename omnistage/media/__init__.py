"""Decoding what clients send (images, audio, video, JSON) under bounds, for every entry point: HTTP routes,
the realtime socket, offline ``Omni`` and families that take raw media. Below the server, so a family or the
engine may decode without importing it; failures are ``omnistage.errors.APIError`` naming the field."""

"""Robot policies served over the wire protocols robot stacks already speak (OpenPI's policy WebSocket)."""

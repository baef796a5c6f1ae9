"""Test support: tiny real-architecture model folders (see ``tiny``) and pytest fixtures (``fixtures``)."""

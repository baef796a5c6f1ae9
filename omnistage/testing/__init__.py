"""Test support, shared by tests and benchmarks: tiny real-architecture model folders (``tiny``), pytest
fixtures (``fixtures``), real HTTP servers in a thread or a subprocess (``server``), one request run to its
end (``streams``) and small test pipelines (``pipelines``)."""

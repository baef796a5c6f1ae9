"""Test support, shared by tests and benchmarks: tiny real-architecture model folders (``tiny``), pytest
fixtures (``fixtures``), real HTTP servers in a thread or a subprocess (``server``), one request run to its
end (``streams``), small test pipelines (``pipelines``) and what a test needs from the machine, skipped here
and failed in CI when missing (``requires``)."""

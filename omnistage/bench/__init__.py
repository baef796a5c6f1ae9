"""Serving benchmark (``omnistage bench serve``: throughput, latency, TTFT/TPOT and per-modality metrics).

datasets -> request functions per task -> runner (arrivals, concurrency,
warm-up) -> metrics -> report (table, JSON, latency PNG).
"""

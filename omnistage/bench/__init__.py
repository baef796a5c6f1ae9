"""Serving benchmark (``omnistage bench serve``, SPEC §8).

datasets -> request functions per task -> runner (arrivals, concurrency,
warm-up) -> metrics -> report (table, JSON, latency PNG).
"""

"""Benchmarks (``make bench``): limiter latency vs django-ratelimit, window accuracy."""

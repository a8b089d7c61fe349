"""The limiter's arithmetic, pure: no I/O, no clock of its own, and of Django only
``ImproperlyConfigured`` for a bad rate or burst.

``rates`` (what ``"5/m"`` means), ``windows`` (which bucket counters a hit writes and a check
reads, and what they add up to) and ``gcra`` (the leaky bucket). Every backend is tested
against them (the model tests).
"""

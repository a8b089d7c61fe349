"""The limiter's arithmetic, pure: no I/O, no Django, no clock of its own.

``rates`` (what ``"5/m"`` means), ``windows`` (which bucket counters a hit writes and a check
reads, and what they add up to), ``gcra`` (the leaky bucket) and ``refusals`` (the bounded
memory of recent refusals). Every backend is tested against them (the model tests).
"""

"""Signals sent by ratelimit_app.

``backend_failed(sender=Backend class, alias, error)``: a counter backend failed; the check
then failed open or closed as configured.

``ratelimited(sender=None, group, subject, usage, request)``: a request was over its limit.
``subject`` is the hashed namespace, never the raw IP or email.
"""

from __future__ import annotations

from django.dispatch import Signal

backend_failed = Signal()
ratelimited = Signal()

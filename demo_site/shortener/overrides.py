"""The demo's per-subject overrides (docs/overrides.rst), seeded by ``demo_seed``.

The three examples of the docs, on the demo's own limits: a partner account gets 10,000
requests an hour on the API (its users' throttle, ``drf:user``); the office network is
exempt from the log-in rule per client address (``login-ip``); and members of the
``premium`` group may create ten times as many links (the shortener's ``shortener:create``).
"""

from __future__ import annotations

from django.contrib.auth.models import Group

from ratelimit_app.models import Override

#: (limit, subject, rate, note) of each example.
EXAMPLES = (
    ("drf:user", "partner", "10000/h", "A partner account: 10,000 an hour on the API."),
    ("login-ip", "203.0.113.0/24", "unlimited", "The office network: no per-IP log-in limit."),
    ("shortener:create", "group:premium", "100/m;1000/d", "Premium: ten times the default."),
)


def seed_overrides() -> int:
    """Create the examples (and the ``premium`` group) when missing; how many were new."""
    Group.objects.get_or_create(name="premium")
    created = 0
    for limit, subject, rate, note in EXAMPLES:
        _, new = Override.objects.get_or_create(
            limit=limit, subject=subject, defaults={"rate": rate, "note": note}
        )
        created += new
    return created

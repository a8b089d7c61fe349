"""The demo's per-subject overrides (docs/overrides.rst), seeded by ``demo_seed``.

The three examples of the docs, on the demo's own limits: a partner account gets 10,000
requests an hour on the API (its users' throttle, ``drf:user``); the office network is
exempt from the log-in rule per client address (``login-ip``); and members of the
``premium`` group may create ten times as many links (the shortener's ``shortener:create``).

The ``partner`` account is seeded with the override, without a usable password (set one
with ``manage.py changepassword partner``): an override naming a username nobody holds
would go to whoever signs up with that name first.
"""

from __future__ import annotations

from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group

from ratelimit_app.models import Override

#: The account the ``drf:user`` example is for.
PARTNER = "partner"
#: (limit, subject, rate, note) of each example.
EXAMPLES = (
    ("drf:user", PARTNER, "10000/h", "A partner account: 10,000 an hour on the API."),
    ("login-ip", "203.0.113.0/24", "unlimited", "The office network: no per-IP log-in limit."),
    ("shortener:create", "group:premium", "100/m;1000/d", "Premium: ten times the default."),
)


def seed_overrides() -> int:
    """Create the examples (and the ``premium`` group and the ``partner`` account) when
    missing; how many examples were new."""
    Group.objects.get_or_create(name="premium")
    user = get_user_model()
    if not user._default_manager.filter(username=PARTNER).exists():
        user._default_manager.create_user(PARTNER)  # no password: an unusable one
    created = 0
    for limit, subject, rate, note in EXAMPLES:
        _, new = Override.objects.get_or_create(
            limit=limit, subject=subject, defaults={"rate": rate, "note": note}
        )
        created += new
    return created

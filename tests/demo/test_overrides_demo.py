"""The demo's overrides (docs/overrides.rst, issue 35 item 9): the ``partner`` override is
the seeded account's, not whoever signs up first as ``partner``."""

from __future__ import annotations

from django.contrib.auth.models import User
from django.test import Client

import ratelimit_app.throttling  # noqa: F401 (registers the DRF scopes the examples name)
from demo_site.shortener.overrides import seed_overrides
from ratelimit_app.models import Override
from tests.demo.conftest import PASSWORD


def sign_up(name: str) -> int:
    data = {
        "username": name,
        "email": f"{name.lower()}@example.com",
        "password1": PASSWORD,
        "password2": PASSWORD,
    }
    return Client().post("/accounts/signup/", data, REMOTE_ADDR="203.0.113.70").status_code


def test_the_partner_account_cannot_be_claimed() -> None:
    seed_overrides()
    assert sign_up("partner") == 400  # taken: the seed made it
    assert not User.objects.get(username="partner").has_usable_password()


def test_every_example_passes_the_admin_form() -> None:
    seed_overrides()
    for row in Override.objects.all():
        row.full_clean()

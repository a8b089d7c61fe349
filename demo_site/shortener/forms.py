"""The shortener's one form: a URL to shorten."""

from __future__ import annotations

from django import forms
from django.core.validators import URLValidator

from demo_site.shortener.models import MAX_URL_LENGTH

#: Only web links: no ``javascript:``, ``data:``, ``file:`` or ``ftp:`` behind a short key.
SCHEMES = ["http", "https"]


class LinkForm(forms.Form):
    """``url``: an http or https URL of at most :data:`MAX_URL_LENGTH` characters.

    A URL typed without a scheme (``example.com/page``) is read as https. Anything else,
    an empty field, a NUL byte, a 3,000-character URL, is a form error, never a 500.
    """

    url = forms.URLField(
        label="Long URL",
        max_length=MAX_URL_LENGTH,
        assume_scheme="https",
        validators=[
            URLValidator(schemes=SCHEMES, message="Enter an http:// or https:// web address.")
        ],
        widget=forms.URLInput(
            attrs={"placeholder": "https://example.com/a/long/page", "autofocus": True}
        ),
    )

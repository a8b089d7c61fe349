"""The shortener's one form: a URL to shorten."""

from __future__ import annotations

from typing import Any
from urllib.parse import urlsplit

from django import forms
from django.core.exceptions import ValidationError
from django.core.validators import URLValidator

from demo_site.shortener.models import MAX_URL_LENGTH

#: Only web links: no ``javascript:``, ``data:``, ``file:`` or ``ftp:`` behind a short key.
SCHEMES = ["http", "https"]


class WebURLValidator(URLValidator):
    """A URL of :data:`SCHEMES`; another scheme is named in an error of its own.

    ``URLField`` replaces the message of every error coded ``invalid`` with its own "Enter a
    valid URL.", so a scheme refused as ``invalid`` could not say why: it is coded
    ``scheme``. A URL that is not one at all is ``invalid``, said once.

    A value longer than :data:`MAX_URL_LENGTH` is not looked at (the URL patterns would only
    spend time on it): the form field's length check reports it, once.
    """

    max_length = MAX_URL_LENGTH

    def __init__(self) -> None:
        super().__init__(schemes=SCHEMES)

    def __call__(self, value: Any) -> None:
        if len(str(value)) > self.max_length:
            return
        try:
            scheme = urlsplit(str(value)).scheme.lower()
        except ValueError:  # "http://[::1": not a URL, which the URL check says
            scheme = ""
        if scheme and scheme not in self.schemes:
            raise ValidationError(
                "Links starting with %(scheme)s cannot be shortened: http and https only.",
                code="scheme",
                params={"scheme": f"{scheme}:"},
            )
        super().__call__(value)


class WebURLField(forms.URLField):
    """``URLField`` with :class:`WebURLValidator` in place of its own validator, which would
    report a bad URL a second time."""

    default_validators = [WebURLValidator()]


class LinkForm(forms.Form):
    """``url``: an http or https URL of at most :data:`MAX_URL_LENGTH` characters.

    A URL typed without a scheme (``example.com/page``) is read as https. Anything else,
    an empty field, a NUL byte, a 3,000-character URL, is a form error, never a 500, and
    each mistake is said once.
    """

    url = WebURLField(
        label="Long URL",
        max_length=MAX_URL_LENGTH,
        assume_scheme="https",
        widget=forms.URLInput(
            attrs={"placeholder": "https://example.com/a/long/page", "autofocus": True}
        ),
    )

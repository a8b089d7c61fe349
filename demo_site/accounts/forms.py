"""Forms of the demo's accounts."""

from __future__ import annotations

from typing import TYPE_CHECKING

from django import forms
from django.contrib.admin.forms import AdminPasswordChangeForm
from django.contrib.auth import get_user_model
from django.contrib.auth.forms import PasswordChangeForm, UserCreationForm
from django.contrib.auth.signals import user_login_failed
from django.http import HttpRequest

from demo_site.accounts.models import MAX_MESSAGE_LENGTH

if TYPE_CHECKING:
    from django.contrib.auth.models import User

    UserCreationFormBase = UserCreationForm[User]
else:  # generic only in django-stubs
    UserCreationFormBase = UserCreationForm


class SignupForm(UserCreationFormBase):
    """Django's sign-up form plus an email address (password resets are sent there).

    One account per address, compared without case, so a reset reaches one person.
    """

    email = forms.EmailField(max_length=254, help_text="For password resets.")

    class Meta(UserCreationForm.Meta):
        model = get_user_model()
        fields = ("username", "email")

    def clean_email(self) -> str:
        email: str = self.cleaned_data["email"].strip()
        if get_user_model().objects.filter(email__iexact=email).exists():
            raise forms.ValidationError("An account already uses this address.")
        return email


class MessageForm(forms.Form):
    """A message for the board."""

    text = forms.CharField(
        label="Message",
        max_length=MAX_MESSAGE_LENGTH,
        widget=forms.TextInput(attrs={"placeholder": "Say something", "autocomplete": "off"}),
    )


class ReportsWrongOldPassword(PasswordChangeForm):
    """Django's password change, which also sends ``user_login_failed`` for a wrong old
    password, as ``authenticate()`` does for a wrong log-in.

    The form checks the old password itself (``check_password``), which sends nothing, and
    its view answers a wrong one with the form again (200): with a stolen session, the old
    password could be guessed without any limit noticing. The signal is what the
    failure-only rules count (``login-pair``, ``login-account``, ``login-ip``).
    """

    #: The request the form was posted with, when the view gives it (for the signal's
    #: receivers, as ``authenticate()`` gives it).
    request: HttpRequest | None = None

    def clean_old_password(self) -> str:
        try:
            old: str = super().clean_old_password()
        except forms.ValidationError:
            user_login_failed.send(
                sender=__name__,
                credentials={"username": self.user.get_username()},
                request=self.request,
            )
            raise
        return old


class AdminReportsWrongOldPassword(ReportsWrongOldPassword, AdminPasswordChangeForm):
    """``/admin/password_change/``'s form (the admin's own, which marks required fields)."""

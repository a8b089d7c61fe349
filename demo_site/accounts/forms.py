"""Forms of the demo's accounts."""

from __future__ import annotations

from typing import TYPE_CHECKING

from django import forms
from django.contrib.auth import get_user_model
from django.contrib.auth.forms import UserCreationForm

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

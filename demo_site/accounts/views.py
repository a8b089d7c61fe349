"""Sign-up, the password changes and the message board. Their limits are rules in settings
(RATELIMIT_RULES): ``signup`` (20 a day per IP), the log-in rules (wrong old passwords count
as wrong log-ins) and ``send-message`` (one a second per user)."""

from __future__ import annotations

from django.contrib import admin, messages
from django.contrib.auth import login
from django.contrib.auth.decorators import login_required
from django.contrib.auth.forms import PasswordChangeForm
from django.contrib.auth.views import PasswordChangeView
from django.http import HttpRequest, HttpResponse, HttpResponseBase
from django.shortcuts import redirect, render
from django.urls import reverse
from django.views.decorators.http import require_http_methods, require_POST, require_safe

from demo_site.accounts.forms import (
    AdminReportsWrongOldPassword,
    MessageForm,
    ReportsWrongOldPassword,
    SignupForm,
)
from demo_site.accounts.models import Message

#: Messages shown on the board.
BOARD_SIZE = 20


@require_http_methods(["GET", "HEAD", "POST"])
def signup(request: HttpRequest) -> HttpResponse:
    """``/accounts/signup/``: create an account and log in (a form with errors: 400)."""
    if request.method != "POST":
        return render(request, "accounts/signup.html", {"form": SignupForm()})
    form = SignupForm(request.POST)
    if not form.is_valid():
        return render(request, "accounts/signup.html", {"form": form}, status=400)
    user = form.save()
    login(request, user, backend="django.contrib.auth.backends.ModelBackend")
    messages.success(request, f"Welcome, {user.get_username()}!")
    return redirect("shortener:index")


class PasswordChange(PasswordChangeView):
    """``/accounts/password_change/``: Django's view, with a form that reports a wrong old
    password as a failed log-in (:class:`~demo_site.accounts.forms.ReportsWrongOldPassword`),
    and a 400 for a form with errors (Django answers 200)."""

    form_class = ReportsWrongOldPassword

    def get_form(self, form_class: type[PasswordChangeForm] | None = None) -> PasswordChangeForm:
        form = super().get_form(form_class)
        if isinstance(form, ReportsWrongOldPassword):
            form.request = self.request
        return form

    def form_invalid(self, form: PasswordChangeForm) -> HttpResponse:
        response = super().form_invalid(form)
        response.status_code = 400
        return response


def admin_password_change(request: HttpRequest) -> HttpResponseBase:
    """``/admin/password_change/``: the admin's page (its context, its "done" page), with
    the form that reports a wrong old password. Wrapped in ``admin.site.admin_view`` in
    the URLconf, as the admin wraps its own."""
    request.current_app = admin.site.name
    view = PasswordChange.as_view(
        form_class=AdminReportsWrongOldPassword,
        success_url=reverse("admin:password_change_done", current_app=admin.site.name),
        extra_context=admin.site.each_context(request),
    )
    return view(request)


def _board(request: HttpRequest, form: MessageForm, status: int = 200) -> HttpResponse:
    board = Message.objects.select_related("sender")[:BOARD_SIZE]
    return render(request, "accounts/messages.html", {"form": form, "board": board}, status=status)


@require_safe
@login_required
def board(request: HttpRequest) -> HttpResponse:
    """``/messages/``: the newest messages and the form to send one."""
    return _board(request, MessageForm())


@require_POST
@login_required
def send_message(request: HttpRequest) -> HttpResponse:
    """``/messages/send/``: post a message (the ``send-message`` rule: one a second)."""
    form = MessageForm(request.POST)
    if not form.is_valid():
        return _board(request, form, status=400)
    user = request.user
    assert user.is_authenticated  # login_required lets nobody else in
    Message.objects.create(sender=user, text=form.cleaned_data["text"])
    return redirect("messages")

"""Sign-up and the message board. Their limits are rules in settings (RATELIMIT_RULES):
``signup`` (20 a day per IP) and ``send-message`` (one a second per user)."""

from __future__ import annotations

from django.contrib import messages
from django.contrib.auth import login
from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.views.decorators.http import require_http_methods, require_POST, require_safe

from demo_site.accounts.forms import MessageForm, SignupForm
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

"""Rules and allow/deny entries kept in the database, edited in the admin.

They apply together with ``RATELIMIT_RULES``, ``RATELIMIT_ALLOW`` and ``RATELIMIT_DENY`` (see
:mod:`ratelimit_app.store` for how a change reaches every process within a second or so,
without a query per request). Validation is the settings' own: :func:`Rule.as_dict` goes
through :func:`ratelimit_app.config.rules.parse_rule`, and an entry through
:func:`ratelimit_app.config.access.parse_entry`, so the admin and the system checks never disagree.
A row is data, not code: its key is a built-in kind and its rate a literal
(:mod:`ratelimit_app.config.limits`); nothing a row names is imported or called.
"""

from __future__ import annotations

from typing import Any

from django.core.exceptions import NON_FIELD_ERRORS, ImproperlyConfigured, ValidationError
from django.db import models
from django.utils import timezone
from django.utils.translation import gettext_lazy as _

from ratelimit_app.algorithms import gcra
from ratelimit_app.config import access, declared, rules


def _lines(text: str) -> list[str]:
    return [line.strip() for line in text.replace(",", "\n").splitlines() if line.strip()]


class Rule(models.Model):
    """A ``RATELIMIT_RULES`` entry kept in the database."""

    ALGORITHM_CHOICES = [
        (gcra.SLIDING_WINDOW, _("sliding window")),
        (gcra.LEAKY_BUCKET, _("leaky bucket")),
    ]
    COUNT_CHOICES = [
        (rules.COUNT_ALL, _("every matching request")),
        (rules.COUNT_FAILURES, _("failed requests only")),
    ]

    name = models.CharField(
        _("name"),
        max_length=100,
        unique=True,
        help_text=_("Unique, without spaces; the counters are kept under it."),
    )
    enabled = models.BooleanField(_("enabled"), default=True)
    path = models.TextField(
        _("path prefixes"),
        blank=True,
        help_text=_("URL path prefixes starting with '/', one per line."),
    )
    url_name = models.TextField(
        _("URL names"),
        blank=True,
        help_text=_("URL names such as 'login' or 'accounts:login', one per line."),
    )
    methods = models.CharField(
        _("methods"),
        max_length=100,
        blank=True,
        help_text=_("HTTP methods separated by commas, e.g. 'POST'; empty: all."),
    )
    key = models.CharField(
        _("key"),
        max_length=200,
        help_text=_(
            "What is counted: 'ip', 'user', 'user_or_ip', 'email', 'device', or "
            "'email:<field>', 'post:<field>', 'get:<name>', 'header:<name>'."
        ),
    )
    rate = models.CharField(
        _("rate"),
        max_length=200,
        help_text=_("'5/m', or several: '5/m;10/d'."),
    )
    count = models.CharField(
        _("count"), max_length=10, choices=COUNT_CHOICES, default=rules.COUNT_ALL
    )
    block = models.BooleanField(
        _("block"),
        default=True,
        help_text=_("Answer 429 over the limit; otherwise only mark the request as limited."),
    )
    fail_open = models.BooleanField(
        _("fail open"),
        default=True,
        help_text=_("When the counter backend is down, let requests through."),
    )
    algorithm = models.CharField(
        _("algorithm"),
        max_length=20,
        choices=ALGORITHM_CHOICES,
        default=gcra.SLIDING_WINDOW,
        help_text=_("Sliding window: at most N per window. Leaky bucket: a steady rate."),
    )
    burst = models.PositiveIntegerField(
        _("burst"),
        null=True,
        blank=True,
        help_text=_("A leaky bucket's capacity; empty: the rate's count."),
    )
    note = models.TextField(_("note"), blank=True)
    created = models.DateTimeField(_("created"), auto_now_add=True)
    updated = models.DateTimeField(_("updated"), auto_now=True)

    class Meta:
        verbose_name = _("rule")
        verbose_name_plural = _("rules")
        ordering = ["name"]
        permissions = [("reset_counters", _("Can reset rate-limit counters"))]

    def __str__(self) -> str:
        return self.name

    def as_dict(self) -> dict[str, Any]:
        """The rule as a ``RATELIMIT_RULES`` entry."""
        out: dict[str, Any] = {"name": self.name, "key": self.key.strip(), "rate": self.rate}
        if _lines(self.path):
            out["path"] = _lines(self.path)
        if _lines(self.url_name):
            out["url_name"] = _lines(self.url_name)
        if _lines(self.methods):
            out["methods"] = _lines(self.methods)
        out.update(count=self.count, block=self.block, fail_open=self.fail_open)
        if self.algorithm != gcra.SLIDING_WINDOW or self.burst is not None:
            out["algorithm"] = self.algorithm
        if self.burst is not None:
            out["burst"] = self.burst
        return out

    def clean(self) -> None:
        """Validate as the system checks validate a settings rule; name the field."""
        if self.name in declared.rule_names():
            raise ValidationError({"name": _("RATELIMIT_RULES already has a rule of this name.")})
        try:
            rules.parse_rule(self.as_dict(), trusted=False)
        except rules.RuleError as exc:
            # Every mistake at once, each under its field (a field the form does not show:
            # above the form).
            own = {f.name for f in self._meta.fields}
            found: dict[str, list[str]] = {}
            for error in exc.errors:
                where = error.field if error.field in own else NON_FIELD_ERRORS
                found.setdefault(where, []).append(error.problem)
            raise ValidationError(found) from exc


class AccessEntry(models.Model):
    """An IP, CIDR network, ``user:<id>`` or email on the allow or the deny list."""

    ALLOW = "allow"
    DENY = "deny"
    LIST_CHOICES = [(ALLOW, _("allow")), (DENY, _("deny"))]

    list = models.CharField(_("list"), max_length=5, choices=LIST_CHOICES)
    value = models.CharField(
        _("value"),
        max_length=320,
        help_text=_("An IP address, a CIDR network (IPv4 or IPv6), 'user:<id>' or an email."),
    )
    note = models.TextField(_("note"), blank=True)
    expires = models.DateTimeField(
        _("expires"), null=True, blank=True, help_text=_("Empty: never.")
    )
    created = models.DateTimeField(_("created"), auto_now_add=True)

    class Meta:
        verbose_name = _("allow/deny entry")
        verbose_name_plural = _("allow and deny lists")
        ordering = ["list", "value"]
        constraints = [
            models.UniqueConstraint(fields=["list", "value"], name="ratelimit_access_unique"),
        ]

    def __str__(self) -> str:
        return f"{self.get_list_display()} {self.value}"

    @property
    def active(self) -> bool:
        return self.expires is None or self.expires > timezone.now()

    def clean(self) -> None:
        self.value = (self.value or "").strip()
        try:
            access.parse_entry(self.value)
        except ImproperlyConfigured as exc:
            raise ValidationError({"value": str(exc)}) from exc

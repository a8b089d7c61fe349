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

from collections.abc import Iterator, Mapping
from types import MappingProxyType
from typing import Any, NamedTuple

from django.contrib.auth import get_user_model
from django.core.exceptions import NON_FIELD_ERRORS, ImproperlyConfigured, ValidationError
from django.core.validators import MinValueValidator
from django.db import models
from django.utils import timezone
from django.utils.choices import BaseChoiceIterator
from django.utils.translation import gettext_lazy as _

from ratelimit_app.algorithms import calendar
from ratelimit_app.config import access, declared, kinds, names, rules, sources
from ratelimit_app.identity import keys
from ratelimit_app.overrides import table as overrides


def _lines(text: str) -> list[str]:
    return [line.strip() for line in text.replace(",", "\n").splitlines() if line.strip()]


class KindChoices(BaseChoiceIterator):
    """The kinds of limit a rule may name (:func:`ratelimit_app.config.kinds.choices`), read
    whenever a form, a filter or a validation asks: a kind registered later is offered too.
    A migration compares it with, and writes it as, the choices it stands for."""

    def __iter__(self) -> Iterator[tuple[str, Any]]:
        yield from kinds.choices()


#: A database rule's ``fallback`` as a settings rule writes it ("never": ``False``, whatever
#: ``RATELIMIT_FALLBACK`` says; "": nothing, as the setting says).
FALLBACK_IN_RULES: Mapping[str, dict[str, Any]] = MappingProxyType(
    {"": {}, "memory": {"fallback": "memory"}, "never": {"fallback": False}}
)


class Rule(models.Model):
    """A ``RATELIMIT_RULES`` entry kept in the database."""

    ALGORITHM_CHOICES = KindChoices()
    COUNT_CHOICES = [
        (rules.COUNT_ALL, _("every matching request")),
        (rules.COUNT_FAILURES, _("failed requests only")),
    ]
    #: What ``fallback`` holds: "" as ``RATELIMIT_FALLBACK`` says, ``"memory"``, ``"never"``
    #: (:data:`FALLBACK_IN_RULES`: each as a settings rule writes it).
    FALLBACK_CHOICES = [
        ("", _("as RATELIMIT_FALLBACK says")),
        ("memory", _("count in each process's memory")),
        ("never", _("never: fail open or closed")),
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
        blank=True,
        help_text=_("'5/m', or several: '5/m;10/d'; empty: only requests in flight are limited."),
    )
    quota = models.CharField(
        _("quota"),
        max_length=40,
        blank=True,
        help_text=_("On the calendar, renewed when its period ends: '10000/month', '500/day'."),
    )
    timezone = models.CharField(
        _("time zone"),
        max_length=64,
        blank=True,
        help_text=_("Whose calendar the quota follows, such as 'Europe/Paris'; empty: TIME_ZONE."),
    )
    concurrent = models.PositiveIntegerField(
        _("in flight"),
        null=True,
        blank=True,
        validators=[MinValueValidator(1)],
        help_text=_("At most this many requests of one subject at once; empty: no such limit."),
    )
    lease = models.CharField(
        _("lease"),
        max_length=20,
        blank=True,
        help_text=_(
            "How long a request in flight holds its place at most, if its worker dies: '30s', "
            "'2m'; empty: a minute."
        ),
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
    fallback = models.CharField(
        _("during an outage"),
        max_length=10,
        choices=FALLBACK_CHOICES,
        blank=True,
        default="",
        help_text=_(
            "While the counter backend is down: count in each process's memory instead of "
            "failing open or closed."
        ),
    )
    algorithm = models.CharField(
        _("algorithm"),
        max_length=20,
        choices=ALGORITHM_CHOICES,
        default=kinds.DEFAULT,
        help_text=_("Sliding window: at most N per window. Leaky bucket: a steady rate."),
    )
    burst = models.PositiveIntegerField(
        _("burst"),
        null=True,
        blank=True,
        help_text=_("A leaky bucket's capacity; empty: the rate's count."),
    )
    cost = models.PositiveIntegerField(
        _("cost"),
        default=1,
        validators=[MinValueValidator(1)],
        help_text=_(
            "How many hits each matching request counts (e.g. 5 for an expensive export)."
        ),
    )
    shadow = models.BooleanField(
        _("dry run"),
        default=False,
        help_text=_("Count and report what it would refuse, but refuse nothing."),
    )
    ban_after = models.PositiveIntegerField(
        _("ban after"),
        null=True,
        blank=True,
        validators=[MinValueValidator(1)],
        help_text=_("Ban a subject refused this many times within the time below; empty: never."),
    )
    ban_within = models.CharField(
        _("within"), max_length=20, blank=True, help_text=_("Such as '10m'.")
    )
    ban_for = models.CharField(
        _("ban for"), max_length=20, blank=True, help_text=_("The first ban, such as '1h'.")
    )
    ban_max = models.CharField(
        _("longest ban"),
        max_length=20,
        blank=True,
        help_text=_("Each further ban doubles, up to this (such as '1d'); empty: no doubling."),
    )
    ban_site = models.BooleanField(
        _("ban on every path"),
        default=False,
        help_text=_("Ban the address on the whole site, not only this rule's paths (IP keys)."),
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
        out: dict[str, Any] = {"name": self.name, "key": self.key.strip()}
        quota = self.quota.strip()
        if self.rate.strip() or (self.concurrent is None and not quota):
            out["rate"] = self.rate
        if quota:
            out["quota"] = quota
        if self.timezone.strip():
            out["timezone"] = self.timezone.strip()
        if self.concurrent is not None:
            out["concurrent"] = self.concurrent
        if self.lease.strip():
            out["lease"] = self.lease.strip()
        if _lines(self.path):
            out["path"] = _lines(self.path)
        if _lines(self.url_name):
            out["url_name"] = _lines(self.url_name)
        if _lines(self.methods):
            out["methods"] = _lines(self.methods)
        out.update(count=self.count, block=self.block, fail_open=self.fail_open)
        out.update(FALLBACK_IN_RULES.get(self.fallback, {}))
        if self.algorithm != kinds.DEFAULT or self.burst is not None:
            out["algorithm"] = self.algorithm
        if self.burst is not None:
            out["burst"] = self.burst
        if self.cost != 1:
            out["cost"] = self.cost
        if self.shadow:
            out["shadow"] = True
        if self.ban_after is not None or self.ban_within or self.ban_for:
            out["ban"] = self.ban_dict()
        return out

    def ban_dict(self) -> dict[str, Any]:
        """The ban fields as a rule's ``ban``."""
        ban: dict[str, Any] = {"after": self.ban_after}
        if self.ban_within.strip():
            ban["within"] = self.ban_within.strip()
        if self.ban_for.strip():
            ban["for"] = self.ban_for.strip()
        if self.ban_max.strip():
            ban["max"] = self.ban_max.strip()
        if self.ban_site:
            ban["scope"] = "site"
        return ban

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
                field = "ban_after" if error.field == "ban" else error.field
                where = field if field in own else NON_FIELD_ERRORS
                found.setdefault(where, []).append(error.problem)
            raise ValidationError(found) from exc


def _errors(exc: overrides.OverrideError) -> ValidationError:
    """Every mistake of an override, each under its field."""
    found: dict[str, list[str]] = {}
    for error in exc.errors:
        found.setdefault(error.field, []).append(str(error))
    return ValidationError(found)


class Expiring:
    """A row with an optional ``expires``."""

    expires: Any

    @property
    def active(self) -> bool:
        return self.expires is None or self.expires > timezone.now()


class AccessEntry(Expiring, models.Model):
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

    def clean(self) -> None:
        self.value = (self.value or "").strip()
        try:
            access.parse_entry(self.value)
        except ImproperlyConfigured as exc:
            raise ValidationError({"value": str(exc)}) from exc


class Override(Expiring, models.Model):
    """Other rates for one subject of one limit (:mod:`ratelimit_app.overrides.table`)."""

    limit = models.CharField(
        _("limit"),
        max_length=overrides.MAX_LIMIT_LENGTH,
        help_text=_("A rule's name, a decorator's group, or 'drf:<scope>'."),
    )
    subject = models.CharField(
        _("subject"),
        max_length=320,
        help_text=_(
            "What the limit's key reads: a username or an email; an IP address or a CIDR "
            "network such as 203.0.113.0/24; or 'group:<name>' for the members of a group "
            "(limits keyed on the user)."
        ),
    )
    rate = models.CharField(
        _("rate"),
        max_length=overrides.MAX_RATE_LENGTH,
        help_text=_("The rate the subject gets instead: '10000/h', '5/m;100/d', or 'unlimited'."),
    )
    expires = models.DateTimeField(
        _("expires"), null=True, blank=True, help_text=_("Empty: never.")
    )
    note = models.TextField(_("note"), blank=True)
    created = models.DateTimeField(_("created"), auto_now_add=True)
    #: When it was last saved: every process reads the overrides changed since it last
    #: looked (:mod:`ratelimit_app.store`), not all of them.
    changed = models.DateTimeField(_("changed"), auto_now=True, db_index=True)

    class Meta:
        verbose_name = _("override")
        verbose_name_plural = _("overrides")
        ordering = ["limit", "subject"]
        constraints = [
            models.UniqueConstraint(fields=["limit", "subject"], name="ratelimit_override_unique"),
        ]

    def __str__(self) -> str:
        return f"{self.limit} {self.subject}: {self.rate}"

    def parsed(self) -> overrides.Override:
        """The override, validated (or :class:`~ratelimit_app.overrides.table.OverrideError`)."""
        return overrides.parse(self.limit, self.subject, self.rate)

    def clean(self) -> None:
        """Validate each field, and that ``limit`` can name a limit: a rule of the settings
        or the database, a DRF scope in force, or else a decorator's group. On a limit
        keyed on the user, a username must be an account's: an override waiting for an
        account that does not exist goes to whoever signs up with that name first."""
        self.limit, self.subject, self.rate = (
            (v or "").strip() for v in (self.limit, self.subject, self.rate)
        )
        try:
            found = self.parsed()
        except overrides.OverrideError as exc:
            raise _errors(exc) from exc
        known = _known(found.limit)
        if known is None:
            problem = _unknown(found.limit)
        else:
            problem = _unfit(known, found.rates) or _no_such_user(known, found.subject)
        if problem:
            raise ValidationError(problem)

    def warning(self) -> str | None:
        """What to tell the person who saved it, though it is valid: an ``unlimited``
        override on a limit keyed on a value the request sends (an email, a form field, a
        header) lifts the limit for anyone who sends that value (None: nothing to say)."""
        try:
            found = self.parsed()
        except overrides.OverrideError:
            return None
        known = _known(found.limit)
        if found.rates != overrides.UNLIMITED or known is None or known.key in OWN_KEYS:
            return None
        return _(
            "%(limit)s is keyed on %(key)s, a value the request sends, not the client's "
            "address or account: anyone who sends '%(subject)s' there is now exempt from it. "
            "Prefer other rates to 'unlimited', or an override on a limit keyed on the IP "
            "or the user."
        ) % {"limit": found.limit, "key": known.key, "subject": found.subject.value}


#: The key kinds whose value is the client's own (its address, its account), not text it
#: sends: an ``unlimited`` override on another key is a bypass for whoever types the value.
OWN_KEYS = frozenset(["ip", *overrides.USER_KINDS])


class _Known(NamedTuple):
    """What an override's form checks of the limit it names."""

    algorithm: str
    burst: int | None
    #: The key's kind (:func:`ratelimit_app.identity.keys.kind`): what a subject is a value of.
    key: str
    #: It limits requests in flight only (no rate): an override, which changes rates, has
    #: nothing to change.
    places_only: bool
    #: The zone of its quota on the calendar (None: it has none).
    quota_zone: str | None = None


def _known(name: str) -> _Known | None:
    """The rule named ``name`` (settings or database) or the DRF scope in force, if any."""
    for rule in declared.rules():
        if rule.name == name:
            lim = rule.limit
            places = lim.algorithm_kind.holds_places
            zones = [r.zone for r in lim.static_rates or () if isinstance(r, calendar.Quota)]
            zone = zones[0] if zones else None
            return _Known(lim.algorithm, lim.burst, keys.kind(lim.key), places, zone)
    if name.startswith(f"{sources.DRF}:"):
        scope = sources.limit(name)
        if scope is None:
            return None
        return _Known(scope.algorithm, scope.burst, keys.kind(scope.key), False)
    row = (
        Rule.objects.filter(name=name)
        .values_list("algorithm", "burst", "key", "rate", "concurrent")
        .first()
    )
    if row is None:
        return None
    algorithm, burst, key, rate, concurrent = row
    return _Known(algorithm, burst, key.strip(), not rate.strip() and concurrent is not None)


def _no_such_user(known: _Known, subject: overrides.Subject) -> dict[str, str] | None:
    """Why ``subject`` cannot be a username of a limit keyed on the user (None: it is an
    account's, or the limit is keyed on something else)."""
    if known.key not in overrides.USER_KINDS or subject.kind != "value":
        return None
    user = get_user_model()
    if user._default_manager.filter(**{user.USERNAME_FIELD: subject.value}).exists():
        return None
    return {
        "subject": _(
            "No account has the username '%(name)s' (usernames match exactly, case "
            "included). Create the account first: an override for a name nobody holds "
            "goes to whoever signs up with it."
        )
        % {"name": subject.value}
    }


def _unknown(name: str) -> dict[str, str] | None:
    """Why ``name`` names no limit (None: it names a DRF scope in force, or may be a
    decorator's group). The admin's form has resolved a view's name to its group already,
    and refused a typo of a view's name (:class:`ratelimit_app.operators.admin.OverrideForm`)."""
    if name.startswith(f"{sources.DRF}:"):
        if sources.limit(name) is not None:
            return None
        known = sorted(n for s in sources.registered() for n in s.limits())
        listed = ", ".join(known) if known else str(_("none"))
        return {"limit": _("No DRF throttle scope of this name (in force: %s).") % listed}
    if "." in name:  # a decorator's default group is a dotted path
        return None
    rule_names = declared.rule_names() | set(Rule.objects.values_list("name", flat=True))
    # One typo, in a short name too (``scam`` for ``scan``), or two slips in a long one.
    close = names.close_to(name, rule_names)
    if close is not None:
        return {
            "limit": _(
                "No rule of this name (did you mean %(name)r?); a decorator's group "
                "is accepted only when it is not that close to a rule's name."
            )
            % {"name": close}
        }
    return None


def _unfit(known: _Known, found: overrides.Rates) -> dict[str, str] | None:
    """Why rates ``found`` cannot replace those of the limit ``known``."""
    if known.places_only:
        return {
            "limit": str(
                _(
                    "This rule limits requests in flight only; an override changes rates, "
                    "never the places a subject may hold at once."
                )
            )
        }
    kind = kinds.KINDS.get(known.algorithm)
    if kind is None or found == overrides.UNLIMITED:
        return None
    fitted = calendar.zoned(found, known.quota_zone)
    if fitted is None:
        return {
            "rate": str(
                _(
                    "A quota by the week or the month overrides a limit's quota on the "
                    "calendar; this limit has none."
                )
            )
        }
    why = kind.unfit(fitted, known.burst)
    return None if why is None else {"rate": why}


class Ban(models.Model):
    """A subject banned by a limit (:mod:`ratelimit_app.bans.applied`): refused outright until
    ``until``, on the limit's requests or, ``site``, on every path. Kept past its end until
    ``remembered_until`` (the ban's ``max`` after it ended): a new ban of the subject before
    then lasts twice as long."""

    limit = models.CharField(_("limit"), max_length=200)
    site = models.BooleanField(_("on every path"), default=False)
    #: The hashed subject (:func:`ratelimit_app.bans.applied.ban_key`): a ban is found from
    #: the request, or from what a person types, never stored in clear.
    key = models.CharField(_("key"), max_length=100, unique=True)
    kind = models.CharField(_("kind"), max_length=100)
    #: What the admin shows of the subject (``RATELIMIT_REFUSED_SUBJECTS``), else nothing.
    label = models.CharField(_("subject"), max_length=100, blank=True)
    #: A ban on every path: its address sealed (:mod:`ratelimit_app.identity.sealing`), so
    #: each process finds a request's ban by its address, without a hash per request.
    sealed = models.CharField(_("sealed address"), max_length=200, blank=True, editable=False)
    seconds = models.PositiveIntegerField(_("seconds"))
    banned_at = models.DateTimeField(_("banned at"))
    until = models.DateTimeField(_("until"), db_index=True)
    #: Deleted once passed (:func:`ratelimit_app.bans.applied.prune`).
    remembered_until = models.DateTimeField(_("remembered until"), db_index=True)
    #: When it was last written (made, extended, lifted): every process reads the bans
    #: changed since it last looked (:mod:`ratelimit_app.store`), not all of them.
    changed = models.DateTimeField(_("changed"), auto_now=True, db_index=True)

    class Meta:
        verbose_name = _("ban")
        verbose_name_plural = _("bans")
        ordering = ["-until"]

    def __str__(self) -> str:
        return f"{self.limit}: {self.label or self.kind} until {self.until:%Y-%m-%d %H:%M:%S}"

    @property
    def active(self) -> bool:
        return self.until > timezone.now()

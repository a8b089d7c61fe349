"""The admin of ratelimit_app: rules, allow and deny lists, usage lookup and reset.

* **Rules**: the database's rules, editable and validated as ``RATELIMIT_RULES`` entries are
  (a bad rate or key is a form error naming it), and, read-only beside them, the rules of
  the settings: the whole configuration in force. A change applies in every process within
  about a second (:mod:`ratelimit_app.store`).
* **Allow and deny lists**: IPs, CIDR networks, ``user:<id>`` and emails, with a note and an
  optional expiry; merged with ``RATELIMIT_ALLOW`` / ``RATELIMIT_DENY``.
* **Overrides**: other rates (or none) for one subject of one limit
  (:mod:`ratelimit_app.overrides.table`), listed beside each rule they concern.
* **Usage lookup**: a rule and a subject (an IP, an email, a user id) give each rate's count,
  remaining and reset; the reset button (POST, CSRF, the ``reset_counters`` permission) clears
  them and is written to the admin log.
* Where ``metrics_app`` is installed, each rule links to the chart of its limited requests
  (the series ``ratelimit:<rule>``).
"""

from __future__ import annotations

import math
from typing import Any

from django import forms
from django.contrib import admin, messages
from django.contrib.admin.models import CHANGE, LogEntry
from django.contrib.admin.widgets import AdminTextareaWidget
from django.contrib.contenttypes.models import ContentType
from django.core.exceptions import ImproperlyConfigured, PermissionDenied
from django.db import models
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import URLPattern, path, reverse
from django.utils.functional import Promise
from django.utils.html import escape, format_html, format_html_join
from django.utils.translation import gettext_lazy as _

from ratelimit_app.bans import applied as bans
from ratelimit_app.config import bans as ban_spec
from ratelimit_app.config import declared, names
from ratelimit_app.exceptions import BackendError
from ratelimit_app.models import AccessEntry, Ban, Override, Rule
from ratelimit_app.operators import operations, refused
from ratelimit_app.operators.metrics import series_name

#: The units of :func:`format_duration`, largest first: seconds each, and how each is written.
DURATION_UNITS = (
    (86400, _("%(n)d d")),
    (3600, _("%(n)d h")),
    (60, _("%(n)d min")),
    (1, _("%(n)d s")),
)


#: The filters of the rules' list, and how many database rules it needs before it offers them.
RULE_FILTERS = ("enabled", "algorithm", "count", "block", "fail_open")
FILTER_FROM = 10


def format_duration(seconds: float) -> str:
    """A wait as people read it: ``"45 s"``, ``"1 min 30 s"``, ``"1 d 0 h 12 min"``.

    The largest unit the wait reaches and at most the two below it, a zero between them
    included (in ``"1 d 0 h 12 min"``, that the hours are zero is information) and zeros
    after them left out (``"1 h"``, not ``"1 h 0 min 0 s"``). Finer units are left out: 87,154
    seconds are ``"1 d 0 h 12 min"`` (the usage page puts the exact seconds in a tooltip). A
    fraction of a second counts as a whole one; nothing, or less, is ``"0 s"``.
    """
    left = max(0, math.ceil(seconds))
    counts: list[tuple[int, str | Promise]] = []
    for size, text in DURATION_UNITS:
        if counts or left >= size or size == 1:
            counts.append((left // size, text))
            left %= size
        if len(counts) == 3:
            break
    while len(counts) > 1 and counts[-1][0] == 0:
        counts.pop()
    return " ".join(str(text) % {"n": n} for n, text in counts)


def chart_url(rule: str, shadow: bool = False) -> str | None:
    """The admin page of the series counting ``rule``'s limited requests (``shadow``: those
    its dry run would refuse), if it exists."""
    from django.apps import apps

    if not apps.is_installed("metrics_app"):
        return None
    from metrics_app.models import Series

    series = Series.objects  # (on the database the project's routers give metrics_app)
    pk = series.filter(name=series_name(rule, shadow)).values_list("pk", flat=True).first()
    if pk is None:
        return None
    try:
        return reverse("admin:metrics_app_series_change", args=[pk])
    except Exception:  # the metrics admin is not registered
        return None


def charts(rule: str) -> str:
    """Links to the charts of ``rule``'s refusals and of what its dry run would refuse
    (each where its series exists), or "-"."""
    links = [
        format_html('<a href="{}">{}</a>', url, text)
        for url, text in (
            (chart_url(rule), _("chart")),
            (chart_url(rule, shadow=True), _("would refuse")),
        )
        if url
    ]
    return format_html_join(" · ", "{}", ((link,) for link in links)) if links else "-"


def rate_text(rule: dict[str, Any]) -> str:
    """A rule's rate as the lists show it (``rule``: a settings rule's dict, as
    ``CompiledRule.describe`` or ``Rule.as_dict`` makes it): ``5/m``, or ``3 in flight``
    for a rule that only limits requests in flight (as ``ratelimit_usage`` writes it)."""
    rate = rule.get("rate") or ""
    if not rate and rule.get("quota"):  # a quota on the calendar alone
        return str(rule["quota"])
    if not rate and rule.get("concurrent"):
        return f"{rule['concurrent']} in flight"
    return str(rate)


def options(rule: dict[str, Any]) -> str:
    """What a rule (a dict, as :func:`rate_text` takes) does beside its rate, in a few
    words: ``cost 5``, ``3 in flight`` (beside a rate), ``ban 1 h`` (its whole ban in the
    tooltip), ``dry run``; "-" for none. The rules list shows it in one column."""
    marks: list[str] = []
    if rule.get("cost", 1) != 1:
        marks.append(escape(_("cost %(cost)s") % {"cost": rule["cost"]}))
    if rule.get("concurrent") and rule.get("rate"):
        marks.append(escape(f"{rule['concurrent']} in flight"))
    if rule.get("quota") and rule.get("rate"):
        marks.append(escape(_("quota %(quota)s") % {"quota": rule["quota"]}))
    if rule.get("ban"):
        marks.append(_ban_mark(rule["ban"]))
    if rule.get("shadow"):
        marks.append(escape(_("dry run")))
    return format_html_join(" · ", "{}", ((m,) for m in marks)) if marks else "-"


def _ban_mark(raw: Any) -> str:
    """``ban 1 h`` (``ban 1 h on every path``), the whole ban in its tooltip; ``ban`` alone
    for a ban that does not validate (its rule is not in force: the form says why)."""
    try:
        spec = ban_spec.parse_ban(raw)
    except ImproperlyConfigured:
        return escape(_("ban"))
    length = format_duration(spec.seconds)
    text = _("ban %(length)s on every path") if spec.site else _("ban %(length)s")
    title = _("%(after)d refusals within %(within)s ban for %(length)s, up to %(longest)s.") % {
        "after": spec.after,
        "within": format_duration(spec.within),
        "length": length,
        "longest": format_duration(spec.most),
    }
    return format_html('<span title="{}">{}</span>', title, text % {"length": length})


def limit_choice(named: operations.Named) -> str:
    """A limit as the usage form lists it, in the admin's language: what
    :meth:`~ratelimit_app.operators.operations.Named.describe` says, with its rates as
    ``ratelimit_usage`` writes them (``5 in flight`` for a limit of requests in flight only,
    ``5/m, 3 in flight`` beside a rate; ``callable`` only for rates a callable gives)."""
    lim = named.limit
    if lim.static_rates is None:
        rates = str(_("callable"))
    elif isinstance(lim.rate, str) and lim.inflight is None:
        rates = lim.rate  # as it was written ("30/m;1000/d")
    else:
        shown = [r.text for r in lim.static_rates]
        if lim.inflight is not None and lim.inflight.static_rates:
            shown += [r.text for r in lim.inflight.static_rates]
        rates = ", ".join(shown)
    if named.kind == "throttle":
        source = _("DRF throttle") if named.source in ("", "DRF throttle") else named.source
        return _("%(name)s — %(source)s, %(rates)s") % {
            "name": named.name,
            "source": source,
            "rates": rates,
        }
    key = lim.key if isinstance(lim.key, str) else str(_("callable"))
    if named.view:
        return _("%(name)s — @ratelimit on %(view)s, key %(key)s, %(rates)s") % {
            "name": named.name,
            "view": named.view,
            "key": key,
            "rates": rates,
        }
    return _("%(name)s — key %(key)s, %(rates)s") % {
        "name": named.name,
        "key": key,
        "rates": rates,
    }


class UsageForm(forms.Form):
    """A limit in force (a rule, a decorated view's group, a DRF scope) and a subject, as a
    person types them."""

    rule = forms.ChoiceField(label=_("Limit"))
    subject = forms.CharField(
        label=_("Subject"),
        max_length=320,
        help_text=_("An IP address, an email address or a user id, as the rule's key reads it."),
    )

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        named = operations.named_limits()
        self.fields["rule"].choices = [(n.name, limit_choice(n)) for n in named]  # type: ignore[attr-defined]

    def clean(self) -> dict[str, Any]:
        data = super().clean() or {}
        if "rule" in data and "subject" in data:
            try:
                found = operations.target(data["rule"], data["subject"])
            except ValueError as exc:
                raise forms.ValidationError(str(exc)) from exc
            if found is None:
                raise forms.ValidationError(
                    {"subject": _("Not a value this rule's key can have.")}
                )
            data["target"] = found
        return data


def readable(usage: dict[str, Any] | None) -> dict[str, Any] | None:
    """``usage`` with its waits also as people read them: ``reset_text`` beside each rate's
    and the whole's ``reset``, ``retry_after_text`` beside ``retry_after``."""
    if usage is None:
        return None
    rates = [{**r, "reset_text": format_duration(r["reset"])} for r in usage["rates"]]
    return {
        **usage,
        "rates": rates,
        "reset_text": format_duration(usage["reset"]),
        "retry_after_text": format_duration(usage["retry_after"]),
        "ban_text": format_duration(usage.get("ban_seconds", 0)),
    }


def overrides_of(limit: str) -> str:
    """Links to the overrides of ``limit`` (each: its subject and rate), and one to add
    another."""
    changelist = reverse("admin:ratelimit_app_override_changelist")
    rows = Override.objects.filter(limit=limit).order_by("subject")[:OVERRIDES_SHOWN]
    links = format_html_join(
        ", ",
        '<a href="{}">{}: {}</a>',
        (
            (reverse("admin:ratelimit_app_override_change", args=[o.pk]), o.subject, o.rate)
            for o in rows
        ),
    )
    more = format_html('<a href="{}?limit={}">{}</a>', changelist, limit, _("all"))
    add = reverse("admin:ratelimit_app_override_add")
    new = format_html('<a href="{}?limit={}">{}</a>', add, limit, _("add"))
    return format_html("{}{}{} · {}", links, " · " if links else "", more, new)


class EscapedHelp(admin.ModelAdmin):
    def formfield_for_dbfield(
        self, db_field: models.Field[Any, Any], request: HttpRequest, **kwargs: Any
    ) -> forms.Field | None:
        """The field, its help text escaped: the admin renders help text as HTML, and the
        help mentions ``'email:<field>'`` or ``'group:<name>'``, which a browser would
        swallow as a tag."""
        field = super().formfield_for_dbfield(db_field, request, **kwargs)
        if field is not None and field.help_text:
            field.help_text = escape(field.help_text)
        return field


#: The overrides a rule's row lists (the rest are a link away).
OVERRIDES_SHOWN = 5


@admin.register(Rule)
class RuleAdmin(EscapedHelp):
    list_display = (
        "name",
        "enabled",
        "where",
        "key",
        "shown_rate",
        "shown_options",
        "count",
        "block",
        "overrides",
        "chart",
    )
    list_filter = RULE_FILTERS
    search_fields = ("name", "path", "url_name", "key", "note")
    # The rule first, the note for people last: what applies is what the form shows first.
    fieldsets = (
        (None, {"fields": ("name", "enabled")}),
        (_("Which requests"), {"fields": ("path", "url_name", "methods")}),
        (
            _("Limit"),
            {
                "fields": (
                    "key",
                    "rate",
                    ("quota", "timezone"),
                    "algorithm",
                    "burst",
                    "cost",
                    ("concurrent", "lease"),
                    "count",
                    "block",
                    "shadow",
                    "fail_open",
                    "fallback",
                )
            },
        ),
        (
            _("Ban"),
            {"fields": (("ban_after", "ban_within"), ("ban_for", "ban_max"), "ban_site")},
        ),
        (_("Overrides"), {"fields": ("overrides",)}),
        (_("Note"), {"fields": ("note",)}),
    )
    readonly_fields = ("overrides",)
    # A few lines each (paths, URL names, the note): the form's fields fit on one screen.
    formfield_overrides = {models.TextField: {"widget": AdminTextareaWidget(attrs={"rows": 3})}}
    change_list_template = "admin/ratelimit_app/rule/change_list.html"

    def get_list_filter(self, request: HttpRequest) -> tuple[str, ...]:
        """The filters, once the database holds enough rules to filter: beside a shorter
        list they only squeeze its table and lengthen the page."""
        return RULE_FILTERS if Rule.objects.count() >= FILTER_FROM else ()

    @admin.display(description=_("path / URL name"))
    def where(self, obj: Rule) -> str:
        return ", ".join(obj.as_dict().get("path", []) + obj.as_dict().get("url_name", []))

    @admin.display(description=_("rate"), ordering="rate")
    def shown_rate(self, obj: Rule) -> str:
        return rate_text(obj.as_dict())

    @admin.display(description=_("options"))
    def shown_options(self, obj: Rule) -> str:
        return options(obj.as_dict())

    @admin.display(description=_("overrides"))
    def overrides(self, obj: Rule) -> str:
        return overrides_of(obj.name) if obj.pk else "-"

    @admin.display(description=_("limited requests"))
    def chart(self, obj: Rule) -> str:
        return charts(obj.name)

    def get_urls(self) -> list[URLPattern]:
        usage = path(
            "usage/",
            self.admin_site.admin_view(self.usage_view),
            name="ratelimit_app_rule_usage",
        )
        lately = path(
            "refused/",
            self.admin_site.admin_view(self.refused_view),
            name="ratelimit_app_rule_refused",
        )
        banning = path(
            "ban/", self.admin_site.admin_view(self.ban_view), name="ratelimit_app_rule_ban"
        )
        return [usage, lately, banning, *super().get_urls()]

    def ban_view(self, request: HttpRequest) -> HttpResponse:
        """Ban a subject of a limit now (the *ban* button of *Refused lately*): a POST of the
        limit, the subject and the hours; needs ``ratelimit_app.add_ban``."""
        if request.method != "POST" or not request.user.has_perm("ratelimit_app.add_ban"):
            raise PermissionDenied
        limit, subject = request.POST.get("rule", ""), request.POST.get("subject", "")
        try:
            hours = int(request.POST.get("hours", "1"))
            until = operations.ban(limit, subject, hours * 3600, request, str(request.user))
        except (ValueError, BackendError) as exc:
            messages.error(request, str(exc))
        else:
            if until is None:
                messages.error(request, _("Not a value this rule's key can have."))
            else:
                messages.success(
                    request,
                    _("Banned %(subject)s from %(limit)s until %(until)s.")
                    % {"subject": subject, "limit": limit, "until": f"{until:%Y-%m-%d %H:%M} UTC"},
                )
        return HttpResponseRedirect(reverse("admin:ratelimit_app_rule_refused"))

    def refused_view(self, request: HttpRequest) -> HttpResponse:
        """*Refused lately* (:mod:`ratelimit_app.operators.refused`)."""
        return refused.page(request, self.admin_site, self.opts)

    def changelist_view(
        self, request: HttpRequest, extra_context: dict[str, Any] | None = None
    ) -> HttpResponse:
        settings_rules = [
            {
                **described,
                "rate": rate_text(described),
                "options": options(described),
                "charts": charts(rule.name),
                "overrides": overrides_of(rule.name),
            }
            for rule in declared.rules()
            for described in (rule.describe(),)
        ]
        context = {
            "title": _("Rate-limit rules"),
            "settings_rules": settings_rules,
            **(extra_context or {}),
        }
        return super().changelist_view(request, extra_context=context)

    def usage_view(self, request: HttpRequest) -> HttpResponse:
        """Look up (and reset) one subject's counters under a rule in force."""
        if not self.has_view_permission(request):
            raise PermissionDenied
        can_reset = request.user.has_perm("ratelimit_app.reset_counters")
        form = UsageForm(request.POST if request.method == "POST" else None)
        usage = None
        if form.is_bound and form.is_valid():
            found: operations.Target = form.cleaned_data["target"]
            rule = form.cleaned_data["rule"]
            try:
                if "reset" in request.POST:
                    if not can_reset:
                        raise PermissionDenied
                    operations.reset(rule, form.cleaned_data["subject"])
                    self._log_reset(request, rule, found.value)
                    messages.success(
                        request,
                        _("Reset %(subject)s for rule %(rule)s.")
                        % {
                            "subject": found.value,
                            "rule": rule,
                        },
                    )
                usage = readable(operations.lookup(rule, form.cleaned_data["subject"]))
            except BackendError as exc:
                messages.error(request, _("The counter backend failed: %s") % exc)
        context = {
            **self.admin_site.each_context(request),
            "opts": self.opts,
            "title": _("Rate-limit usage"),
            "form": form,
            "usage": usage,
            "can_reset": can_reset,
            "chart": chart_url(form.cleaned_data["rule"]) if usage else None,
        }
        return TemplateResponse(request, "admin/ratelimit_app/rule/usage.html", context)

    def _log_reset(self, request: HttpRequest, rule: str, subject: str) -> None:
        row = Rule.objects.filter(name=rule).first()
        LogEntry.objects.create(
            user_id=request.user.pk or 0,
            content_type=ContentType.objects.get_for_model(Rule),
            object_id=str(row.pk) if row else None,
            object_repr=rule[:200],
            action_flag=CHANGE,
            change_message=f"Reset the rate-limit counters of {subject}.",
        )


@admin.register(AccessEntry)
class AccessEntryAdmin(admin.ModelAdmin):
    list_display = ("value", "list", "note", "expires", "is_active")
    list_filter = ("list",)
    search_fields = ("value", "note")
    fields = ("list", "value", "note", "expires")

    @admin.display(boolean=True, description=_("active"))
    def is_active(self, obj: AccessEntry) -> bool:
        return obj.active

    def changelist_view(
        self, request: HttpRequest, extra_context: dict[str, Any] | None = None
    ) -> HttpResponse:
        context = {
            "settings_allow": list(getattr_setting("RATELIMIT_ALLOW")),
            "settings_deny": list(getattr_setting("RATELIMIT_DENY")),
            **(extra_context or {}),
        }
        return super().changelist_view(request, extra_context=context)

    change_list_template = "admin/ratelimit_app/accessentry/change_list.html"


@admin.register(Ban)
class BanAdmin(admin.ModelAdmin):
    """The subjects banned lately (each with its end); deleting a ban lifts it, and its
    memory of earlier bans (the next is a first one). Bans are made by limits, not here."""

    list_display = ("limit", "subject", "kind", "site", "until", "length", "is_active")
    list_filter = ("limit", "site")
    search_fields = ("limit", "label")
    readonly_fields = [f.name for f in Ban._meta.fields]

    @admin.display(description=_("subject"))
    def subject(self, obj: Ban) -> str:
        return obj.label or str(_("(hashed)"))

    @admin.display(description=_("length"), ordering="seconds")
    def length(self, obj: Ban) -> str:
        return format_duration(obj.seconds)

    @admin.display(boolean=True, description=_("active"))
    def is_active(self, obj: Ban) -> bool:
        return obj.active

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def delete_model(self, request: HttpRequest, obj: Ban) -> None:
        """Deleting a ban lifts it (the row stays, ended, until it is pruned): every
        process reads the change as it reads a new ban's, not every ban again."""
        bans.lift_rows(Ban.objects.filter(pk=obj.pk))

    def delete_queryset(self, request: HttpRequest, queryset: Any) -> None:
        bans.lift_rows(queryset)


class OverrideForm(forms.ModelForm):
    """An override, its limit named as the usage page and the commands name one
    (:func:`ratelimit_app.operators.operations.filed_names`): a view's URL name, path or dotted
    path is filed under its decorator's group, the name the limiter looks overrides up by."""

    class Meta:
        model = Override
        fields = ("limit", "subject", "rate", "expires", "note")

    def clean_limit(self) -> str:
        """The name the override is filed under; an error for a view whose decorators have
        several groups, and for a name no limit has one typo away from one the site knows
        (the model refuses a typo of a rule's name and an unknown DRF scope)."""
        typed = str(self.cleaned_data.get("limit") or "").strip()
        rules = declared.rule_names() | set(Rule.objects.values_list("name", flat=True))
        if typed in rules or typed.startswith("drf:"):
            return typed
        try:
            filed = operations.filed_names(typed)
        except ValueError:  # a decorator's group on no routed view, or a typo
            known = operations.known_names() - rules  # (the model's check for a rule's)
            close = None if "." in typed else names.close_to(typed, known)
            if close is None:
                return typed
            problem = _(
                "No limit of this name (did you mean %(name)r?); a decorator's group "
                "is accepted only when it is not that close to a limit's name."
            ) % {"name": close}
        else:
            if len(filed) == 1:
                return filed[0]
            problem = _(
                "%(name)s stands for several limits, each with overrides of its own: "
                "%(names)s. Name one of them."
            ) % {"name": typed, "names": ", ".join(filed)}
        # The model's validation still runs: on the name as typed, not on an empty one.
        self.instance.limit = typed
        raise forms.ValidationError(problem)


@admin.register(Override)
class OverrideAdmin(EscapedHelp):
    """Overrides; the "add" link of a rule fills in its name (``?limit=``)."""

    form = OverrideForm
    list_display = ("limit", "subject", "rate", "expires", "is_active")
    list_filter = ("limit",)
    search_fields = ("limit", "subject", "note")
    fields = ("limit", "subject", "rate", "expires", "note")

    @admin.display(boolean=True, description=_("active"))
    def is_active(self, obj: Override) -> bool:
        return obj.active

    def save_model(self, request: HttpRequest, obj: Override, form: Any, change: bool) -> None:
        """Save it, and warn (without refusing) of an ``unlimited`` override on a value the
        request sends: anyone who sends the value escapes the limit
        (:meth:`Override.warning <ratelimit_app.models.Override.warning>`). Say so when the
        limit was named by its view: the override is filed under the decorator's group."""
        super().save_model(request, obj, form, change)
        typed = str(form.data.get("limit", obj.limit)).strip()
        if typed != obj.limit:
            messages.info(
                request,
                _("%(typed)s is filed as %(limit)s: the name its limit's counters go by.")
                % {"typed": typed, "limit": obj.limit},
            )
        warning = obj.warning()
        if warning:
            messages.warning(request, warning)


def getattr_setting(name: str) -> list[str]:
    from django.conf import settings

    value = getattr(settings, name, ())
    return [str(v) for v in value] if isinstance(value, list | tuple) else []

"""What the settings declare: ``RATELIMIT_RULES``, ``RATELIMIT_ALLOW`` and ``RATELIMIT_DENY``,
validated and compiled once, and again after a setting changes.

Invalid rules and lists are left out and logged here; the system checks
(:mod:`ratelimit_app.checks`) report them with their codes. The database's rules and entries
are merged with these by :mod:`ratelimit_app.store`, which holds the configuration in force.
"""

from __future__ import annotations

import logging

from django.core.exceptions import ImproperlyConfigured

from ratelimit_app.conf import read
from ratelimit_app.config.access import EMPTY, AccessList, compile_list
from ratelimit_app.config.rules import CompiledRule, parse_rules
from ratelimit_app.runtime import RUNTIME

logger = logging.getLogger("ratelimit_app")


def rules() -> tuple[CompiledRule, ...]:
    """``RATELIMIT_RULES``, validated (invalid rules are left out and logged); a part of
    the runtime."""
    return RUNTIME.part(_rules)


def _rules() -> tuple[CompiledRule, ...]:
    found, errors = parse_rules(read("RATELIMIT_RULES"))
    for error in errors:
        logger.error("ratelimit: %s (rule left out)", error)
    return tuple(found)


def rule_names() -> set[str]:
    """Names of the rules in ``RATELIMIT_RULES`` (a database rule may not reuse one)."""
    return {rule.name for rule in rules()}


def access_list(name: str) -> AccessList:
    """``RATELIMIT_ALLOW`` or ``RATELIMIT_DENY``, compiled (an invalid list is logged and
    ignored); parts of the runtime."""
    return RUNTIME.part(_allowed if name == "RATELIMIT_ALLOW" else _denied)


def _allowed() -> AccessList:
    return _compiled_list("RATELIMIT_ALLOW")


def _denied() -> AccessList:
    return _compiled_list("RATELIMIT_DENY")


def _compiled_list(name: str) -> AccessList:
    try:
        return compile_list(read(name))
    except ImproperlyConfigured as exc:
        logger.error("ratelimit: %s: %s (list ignored)", name, exc)
        return EMPTY

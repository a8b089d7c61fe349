"""The engine: one request's checks in one backend round trip.

A check (:class:`~ratelimit_app.config.limits.Check`) names a subject's limit; :func:`check_many`
runs each through the step of its algorithm (:mod:`.step`: :mod:`.sliding_window`,
:mod:`.leaky_bucket`) in one round trip and evaluates it into a :class:`Result`. A refused
hit is taken back; a refusal whose wait is exact is remembered by this process
(:mod:`ratelimit_app.engine.refusals`) and answered from memory while it lasts.
:mod:`ratelimit_app.engine.enforce` is the one caller that decides requests.
"""

from __future__ import annotations

from ratelimit_app.config.limits import Check
from ratelimit_app.engine.checking import charge, check_many, report_failure, take_back
from ratelimit_app.engine.result import Result, failure_dict, meter_result, usage_dict

__all__ = [
    "Check",
    "Result",
    "charge",
    "check_many",
    "failure_dict",
    "meter_result",
    "report_failure",
    "take_back",
    "usage_dict",
]

"""The public path of the operators' functions in code (:mod:`ratelimit_app.operators.operations`):
``from ratelimit_app.operations import ban, reset``, as docs/operators writes it."""

from ratelimit_app.operators.operations import *  # noqa: F403

"""The answers to a limited (429), denied (403) or unprotected (503) request, for a project's
own exception handler or view (``from ratelimit_app.responses import too_many_requests``):
the public face of :mod:`ratelimit_app.engine.responses`, where the engine answers."""

from ratelimit_app.engine.responses import *  # noqa: F403

"""The key functions and helpers a project's own keys use (``from ratelimit_app.keys import
client_ip, form_value, normalize_email``): the public face of
:mod:`ratelimit_app.identity.keys`, where the request's features live beside the client's
address and the subjects' namespaces."""

from ratelimit_app.identity.keys import *  # noqa: F403

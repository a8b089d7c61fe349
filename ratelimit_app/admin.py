"""Where Django looks for the app's admin: its pages are :mod:`ratelimit_app.operators.admin`,
which registers them when imported."""

from ratelimit_app.operators import admin  # noqa: F401  (registers the admin's pages)

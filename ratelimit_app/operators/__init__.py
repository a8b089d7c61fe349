"""The operators' tools: what a person running the site uses, above the engine.

:mod:`.operations` (a limit's counters found by the names people know, looked up, reset; a
subject banned or unbanned: what the admin and the management commands call),
:mod:`.admin` (the admin's pages for rules, lists, bans and overrides),
:mod:`.refused` (its *Refused lately* page), :mod:`.metrics` (the 429s counted per limit,
into ``metrics_app``) and :mod:`.telemetry` (Prometheus and OpenTelemetry). Django loads
``ratelimit_app.admin`` by name and projects import ``ratelimit_app.operations``; both are
kept as the public faces of these modules.
"""

"""Bans, in one home: what a ban is, the bans a process holds, and how a request meets them.

:mod:`.spec` parses and validates a limit's ``ban`` (pure, beside the arithmetic);
:mod:`.held` is the bans in force that every process keeps in memory, read from the
database by the configuration in force (:mod:`ratelimit_app.config.store`); :mod:`.applied`
imposes, finds and lifts them and refuses a banned request from memory (beside the engine,
which asks it before the round trip). This face imports none of them, so the configuration
can read :mod:`.spec` without the engine.
"""

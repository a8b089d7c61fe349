"""The bans, in one home: those in force that every process holds, and how one is imposed,
found, lifted and pruned.

:mod:`.held` is the bans in force that every process keeps in memory, read from the
database by the configuration in force (:mod:`ratelimit_app.store`); :mod:`.applied`
writes a ban's row when a refusal reaches its limit's ban, lifts and finds them for the
operators, and deletes the rows whose memory has passed. The engine looks a request's checks
up in what is held before the round trip (:mod:`ratelimit_app.engine.checking`). What a
limit's ``ban`` option says is the limit's (:mod:`ratelimit_app.config.bans`). This face
imports neither module.
"""

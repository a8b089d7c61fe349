"""Per-subject overrides, in one home: what an operator declares and how a request takes it.

:mod:`.table` validates an override (a limit, a subject, a rate) and compiles those in force
into the :class:`~.table.Table` the configuration snapshot holds (layer 2, beside the
configuration); :mod:`.applied` replaces a request's checks by the rates its subjects are
given (layer 4, beside the engine, which asks it before the round trip).
"""

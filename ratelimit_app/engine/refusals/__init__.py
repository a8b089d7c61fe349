"""The refusal memory, in one home: what a process remembers of its refusals.

:mod:`.memory` is the bounded, thread-safe map itself (pure); :mod:`.remembered` keeps this
process's refusals in it, keyed by each check's subject; :mod:`.recall` confirms the
refusals that are due with one look that counts nothing. The engine answers from it before
a round trip (:mod:`ratelimit_app.engine.enforce`). This face imports none of them.
"""

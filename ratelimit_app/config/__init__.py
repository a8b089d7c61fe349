"""What a project configured, read and validated once.

``conf`` (the ``RATELIMIT_*`` settings), ``limits`` (a validated limit and its check of a
request), ``rules`` and ``declared`` (settings rules and database rules compiled), ``access``
(allow and deny lists), ``sources`` (where each kind of limit is declared), ``store`` (the
current snapshot every process reads) and ``checks`` (the system checks).
"""

"""Django REST framework's own throttling tests, run against ``ratelimit_app.throttling``.

``test_throttling.py.txt`` is ``tests/test_throttling.py`` of the djangorestframework
:data:`~tests.peers.drf_suite.upstream.VERSION` sdist, byte for byte (BSD-3-Clause, Copyright
© 2011-present Encode OSS Ltd: ``LICENSE.md`` beside it). It is kept as text, not as a module,
so neither pytest nor our linters read it; :mod:`.upstream` loads it with
``rest_framework.throttling`` mapped to ``ratelimit_app.throttling`` while it is imported:
the import swap, and nothing else. Copied, not fetched: the suite runs offline (CI).

To move to another release: ``pip download djangorestframework==<ver> --no-deps --no-binary
:all:``, copy its ``tests/test_throttling.py`` over the text file, and update ``VERSION`` and
``SHA256`` in :mod:`.upstream` (a test fails while the installed release and the copy
differ).
"""

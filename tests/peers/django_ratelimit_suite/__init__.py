"""django-ratelimit 4.1's own ``tests.py``, run unchanged against ``ratelimit_app``.

The file is loaded from the installed wheel (never copied) by :mod:`.aliases`, with the
``django_ratelimit`` names mapped to ours only while it is imported and while each of its
tests runs (:mod:`.conftest`), so the real package stays importable for the benchmarks and
``tests/ratelimit/test_core.py``.
"""

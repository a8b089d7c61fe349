"""Series names: which strings can name a series, checked before anything is counted.

A leaf module (it imports nothing of metrics_app), so the ``Series`` model, which sizes its
column with :data:`MAX_NAME_LENGTH`, and the buffer, which checks each name it is given,
both build on it without importing each other.
"""

from __future__ import annotations

__all__ = ["MAX_NAME_LENGTH", "check_name"]

#: Longest series name :func:`metrics_app.record` accepts (the ``Series.name`` column's size).
MAX_NAME_LENGTH = 200


def check_name(name: object) -> str:
    """Return ``name`` if it can name a series, else raise ``ValueError`` saying why.

    A name is a ``str`` of 1 to :data:`MAX_NAME_LENGTH` characters that every database can
    store: no NUL, no lone surrogate. Other unprintable characters (a tab, say) are allowed.
    """
    if type(name) is not str or not 0 < len(name) <= MAX_NAME_LENGTH:
        raise ValueError(
            f"metric names are strings of 1 to {MAX_NAME_LENGTH} characters, got {name!r:.60}"
        )
    if "\x00" in name or (not name.isprintable() and not _encodable(name)):
        # A name the database refuses would fail its whole flush batch, again and again.
        raise ValueError(f"metric names cannot hold NUL or lone surrogates, got {name!r:.60}")
    return name


def _encodable(name: str) -> bool:
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True

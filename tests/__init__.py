"""Test suite for django-bucketry (kept outside the packages)."""

"""Management commands of ratelimit_app: ``ratelimit_usage`` and ``ratelimit_reset``."""

"""In-process traffic metrics for Django on multi-level time buckets."""

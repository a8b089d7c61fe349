"""Benchmarks (``make bench``), one per documented claim, in :mod:`bench.claims`.

``bench/README.md`` maps each claim of the docs to its benchmark. The modules at this level
are what the benchmarks share (:mod:`bench.common`) and the Django site of the load bench
(:mod:`bench.load_site`, :mod:`bench.load_urls`, :mod:`bench.load_floor`).
"""

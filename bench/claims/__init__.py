"""The benchmarks behind the numbers the docs state; ``bench/README.md`` maps each claim to
its module. What they share (statistics, tables, throwaway servers, the load bench's site) is
one level up, in :mod:`bench`."""

"""Task pools, executable environment runtimes and verifiers.

Nothing in this package imports Dagster. Pools register by name in :mod:`envs.registry` and are
imported into the lake as the ``environments`` and ``tasks`` tables.
"""

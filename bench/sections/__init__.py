"""The sections of bench/RESULTS.md, one module per kind (``bench/run_all.py`` runs them)."""

"""Package-backed pools: each module loads its tasks and registers its runtime.

* ``reasoning_gym``: datasets x N seeded tasks, each dataset one environment, ``score_answer``.
* ``bfcl``: BFCL multi-turn (base, miss_func, miss_param, long_context), official checker.
* ``tau2``: tau2-bench airline, retail, telecom, DB-state evaluator (no LLM user).
"""

"""The step service: everything one training step needs, over the lake, without Dagster.

    pools        pool rows -> ``environments`` / ``tasks`` / ``task_latents``
    state_store  the scheduler states the lake keeps (``state/step=t/scheduler.npz``)
    fold         rollouts t folded into the state after t-1; any state, kept or folded again
    select       state after t-1 -> manifest t (``manifests[t]``) + its audit
    yields       predicted vs realized share of informative groups; over-sampling factor
    statistics   rollouts t -> state after t + ``statistics[t]``
    ingest       an external trainer's rollouts, validated and written atomically
    loop         what the loop does next; status; the per-step summary

The Dagster assets are thin wrappers over these functions; the CLI ``step`` commands and the
Python API (:mod:`envsched_pipeline.api`) call them directly. The training itself
(``rollouts[t]``, ``train_metrics[t]``) is :mod:`trainer.step`, launched as its own process.
"""

"""The neural learner: a small pointer policy trained with GRPO in the real sandboxed environments."""

# the per-step update statistics the learner reports (``NeuralLearner.learn``) that the pipeline's
# train_metrics and the bench's records (as update_<name> series) keep: how hard the step pushed and
# how far the policy had moved from what sampled the episodes. Here, not in the learner module, so
# readers of the name do not load torch.
UPDATE_DIAGNOSTICS = (
    "grad_norm",
    "clip_fraction",
    "kl",
    "entropy",
    "log_ratio_max",
    "negative_ratio_over3",
    "forced_stop_logp",
)

"""The neural learner: a small pointer policy trained with GRPO in the real sandboxed environments."""

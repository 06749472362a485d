"""An optimizer for tests that compare gradients: it records them instead of moving the weights
(comparing weight deltas would lose the gradients' low bits to the weights' rounding)."""

from __future__ import annotations

import torch


class GradientTaker(torch.optim.Optimizer):
    def __init__(self, params):
        super().__init__(params, {})
        self.grads: list[torch.Tensor] = []

    @torch.no_grad()
    def step(self, closure=None):
        self.grads = [
            p.grad.clone() if p.grad is not None else torch.zeros_like(p)
            for group in self.param_groups
            for p in group["params"]
        ]


def assert_scaled(base: list[torch.Tensor], scaled: list[torch.Tensor], factor: float) -> None:
    """Every gradient of ``scaled`` is ``factor`` times the one of ``base`` (and some are non-zero)."""
    assert any(g.abs().max() > 0 for g in base), "no gradient at all"
    for a, b in zip(base, scaled, strict=True):
        torch.testing.assert_close(b, a * factor, rtol=1e-4, atol=1e-6 * float(a.abs().max()) + 1e-12)

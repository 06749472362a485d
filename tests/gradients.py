"""An optimizer for tests that compare gradients: it records them instead of moving the weights
(comparing weight deltas would lose the gradients' low bits to the weights' rounding)."""

from __future__ import annotations

import torch


class GradientTaker(torch.optim.Optimizer):
    def __init__(self, params):
        super().__init__(params, {"lr": 0.0})  # a rate, as every optimizer has (the trainer reports it)
        self.grads: list[torch.Tensor] = []

    @torch.no_grad()
    def step(self, closure=None):
        self.grads = [
            p.grad.clone() if p.grad is not None else torch.zeros_like(p)
            for group in self.param_groups
            for p in group["params"]
        ]


def assert_scaled(base: list[torch.Tensor], scaled: list[torch.Tensor], factor: float) -> None:
    """Every gradient of ``scaled`` is ``factor`` times the one of ``base`` (and some are non-zero).

    The two losses sum the same float32 terms in a different order, so an element that is a near
    cancellation of large terms differs in its low bits (seen: 3e-7 on a tensor whose largest element
    is 0.1, under load). Each element is held to 1e-4 of its tensor's largest one, and the whole
    gradient's norm ratio to 1e-5: a wrong factor (here 1 instead of about 0.5) fails both by orders
    of magnitude."""
    assert any(g.abs().max() > 0 for g in base), "no gradient at all"
    for a, b in zip(base, scaled, strict=True):
        torch.testing.assert_close(b, a * factor, rtol=1e-3, atol=1e-4 * float(a.abs().max()) + 1e-12)
    ratio = float(
        torch.sqrt(sum((g.double() ** 2).sum() for g in scaled) / sum((g.double() ** 2).sum() for g in base))
    )
    assert abs(ratio - factor) <= 1e-5 * factor, (ratio, factor)

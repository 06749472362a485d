"""GRPO loss (torch): token-level clipped surrogate, optional KL to a reference policy.

Shapes: B sequences x T tokens. ``mask`` is 1 on tokens the policy generated (assistant turns)
and 0 on prompt, tool-result and padding tokens.

Aggregation (documented choice): ``token-mean`` (default, as in DAPO / Dr. GRPO practice) averages
the per-token loss over all policy tokens of the batch, so long and short responses weigh each of
their tokens equally; ``seq-mean`` (the original GRPO) averages within each sequence first, then
over sequences.
"""

from __future__ import annotations

import math

import torch

from envsched_pipeline.run import SAMPLER_CORRECTIONS


def token_logprobs(logits: torch.Tensor, input_ids: torch.Tensor) -> torch.Tensor:
    """Log-probability of each next token. logits (B, T, V), input_ids (B, T) -> (B, T) where
    position t holds log p(input_ids[t] | input_ids[:t]); position 0 is 0."""
    logp = torch.log_softmax(logits[:, :-1].float(), dim=-1)
    picked = logp.gather(-1, input_ids[:, 1:].unsqueeze(-1)).squeeze(-1)
    return torch.nn.functional.pad(picked, (1, 0), value=0.0)


def grpo_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    clip_eps: float = 0.2,
    kl_coef: float = 0.0,
    ref_logprobs: torch.Tensor | None = None,
    aggregation: str = "token-mean",
    dual_clip: float = 0.0,
    clip_eps_high: float | None = None,
    token_weights: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict]:
    """logprobs, old_logprobs, mask: (B, T); advantages: (B,) per sequence (broadcast over tokens).

    per-token loss = -min(r * A, clip(r, 1 - eps, 1 + eps_high) * A) [+ kl_coef * KL_k3], r = exp(lp - old).

    ``clip_eps_high`` (default: ``clip_eps``) is the upper clip range alone: DAPO's clip-higher
    (e.g. 0.28 over 0.2) lets a positive advantage raise an unlikely token's probability further
    in one update before its gradient stops, which keeps the policy's entropy from collapsing.

    ``dual_clip`` = c > 1 bounds the surrogate of a negative advantage from below by c * A (dual-clip
    PPO): PPO's min() leaves -r * A unbounded as r grows when A < 0, so one token whose probability
    rose a lot since it was sampled can dominate (or overflow) the step. With it set, r is also
    capped at c before the exp (past c the loss is flat for either sign of A, so the cap changes no
    value or gradient and an overflowing ratio cannot turn the backward pass into NaN). 0 = off.

    ``token_weights`` (B, T), no gradient: each token's surrogate is multiplied by it (the KL term
    is not), e.g. the sampler correction's importance weights (``sampler_weights``).
    """
    if dual_clip and dual_clip <= 1.0:
        raise ValueError(f"dual_clip must be > 1 (or 0 = off), got {dual_clip}")
    mask = mask.to(logprobs.dtype)
    adv = advantages.to(logprobs.dtype).unsqueeze(-1)
    log_ratio = logprobs - old_logprobs
    # tokens the dual clip holds (A < 0 and r >= c): they give no gradient this pass
    held = (adv < 0) & (log_ratio.detach() >= math.log(dual_clip)) if dual_clip else None
    if dual_clip:
        log_ratio = log_ratio.clamp(max=math.log(dual_clip))
    ratio = torch.exp(log_ratio)
    surr1 = ratio * adv
    high = clip_eps if clip_eps_high is None else clip_eps_high
    surr2 = torch.clamp(ratio, 1.0 - clip_eps, 1.0 + high) * adv
    surr = torch.minimum(surr1, surr2)
    if dual_clip:
        surr = torch.where(adv < 0, torch.maximum(surr, dual_clip * adv), surr)
    per_token = -surr
    if token_weights is not None:
        per_token = per_token * token_weights.detach().to(per_token.dtype)
    kl = torch.zeros_like(per_token)
    if kl_coef > 0:
        if ref_logprobs is None:
            raise ValueError("kl_coef > 0 needs ref_logprobs")
        d = ref_logprobs - logprobs
        kl = torch.exp(d) - d - 1.0  # k3 estimator, >= 0
        per_token = per_token + kl_coef * kl
    if aggregation == "token-mean":
        loss = (per_token * mask).sum() / mask.sum().clamp_min(1.0)
    elif aggregation == "seq-mean":
        per_seq = (per_token * mask).sum(-1) / mask.sum(-1).clamp_min(1.0)
        loss = per_seq.mean()
    else:
        raise ValueError(f"unknown aggregation {aggregation!r}")
    with torch.no_grad():
        n = mask.sum().clamp_min(1.0)
        clipped = ((ratio < 1.0 - clip_eps) | (ratio > 1.0 + high)).to(mask.dtype)
        stats = {
            "clip_fraction": float((clipped * mask).sum() / n),
            "dual_clip_fraction": float((held.to(mask.dtype) * mask).sum() / n) if dual_clip else 0.0,
            "kl": float((kl * mask).sum() / n),
            "ratio_mean": float((ratio * mask).sum() / n),
        }
    return loss, stats


SAMPLER_STATS = ("tokens", "unknown_tokens", "abs_diff", "max_abs_diff", "kl", "weight", "corrected")


def sampler_weights(
    logprobs: torch.Tensor, sampler_logprobs: torch.Tensor, mask: torch.Tensor, mode: str, cap: float
) -> tuple[torch.Tensor, dict]:
    """Importance weights that correct the update for the sampler's numerics (vLLM's kernels, or
    another precision, draw tokens from a distribution a little off the trainer's).

    ``logprobs``: the trainer's log-probabilities of the tokens before the update (B, T);
    ``sampler_logprobs``: the sampler's for the same tokens (NaN where unknown); ``mask``: the
    policy's tokens. The weight of a token is w = exp(logprobs - sampler_logprobs), the ratio of the
    policy the update assumes to the one that drew the token, and then ``mode``:

    * ``truncate`` (truncated importance sampling): min(w, cap); an off token weighs at most cap.
    * ``mask``: w inside [1 / cap, cap], 0 outside: a token the two disagree on by more than a factor
      of cap gives no gradient at all.
    * ``off``: 1 (the numbers below are still measured).

    A token without a sampler log-probability weighs 1. Returns the weights (1 off the mask) and
    sums over the known policy tokens (SAMPLER_STATS: their count, the unknown ones, sum of
    |logprobs - sampler_logprobs|, its max, the k3 estimate of KL(sampler || trainer), the weights,
    the tokens the mode changed)."""
    if mode not in SAMPLER_CORRECTIONS:
        raise ValueError(f"unknown sampler correction {mode!r}")
    policy = mask > 0
    known = policy & torch.isfinite(sampler_logprobs)
    d = torch.where(known, logprobs.float() - torch.nan_to_num(sampler_logprobs.float()), 0.0)
    raw = torch.exp(d.clamp(max=80.0))  # past e^80 any cap holds it; keeps the sums finite
    if mode == "truncate":
        outside = raw > cap
        w = raw.clamp(max=cap)
    elif mode == "mask":
        outside = (raw > cap) | (raw < 1.0 / cap)
        w = torch.where(outside, 0.0, raw)
    else:
        outside = torch.zeros_like(known)
        w = torch.ones_like(raw)
    weights = torch.where(known, w, 1.0)
    stats = {
        "tokens": float(known.sum()),
        "unknown_tokens": float((policy & ~known).sum()),
        "abs_diff": float(d.abs()[known].sum()),
        "max_abs_diff": float(d.abs()[known].max()) if known.any() else 0.0,
        "kl": float((raw - d - 1.0)[known].sum()),
        "weight": float(weights[known].sum()),
        "corrected": float((outside & known).sum()),
    }
    return weights, stats


def clipped_step(optimizer: torch.optim.Optimizer, parameters, max_norm: float) -> float:
    """Clip the gradient norm to ``max_norm`` and take the optimizer step, only if the norm is finite.

    Returns the norm before clipping. A non-finite norm (an overflowing ratio: a token or decision
    whose probability grew by more than e^88 since it was sampled) cannot be clipped into a usable
    step, and one such step makes every weight NaN: the gradient is dropped instead and the
    weights stay as they were. Callers count the non-finite returns as skipped updates."""
    norm = float(torch.nn.utils.clip_grad_norm_(parameters, max_norm))
    if math.isfinite(norm):
        optimizer.step()
    else:
        optimizer.zero_grad(set_to_none=True)
    return norm

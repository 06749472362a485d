"""The GRPO policy update (torch): group advantages, token-level clipped surrogate, AdamW,
gradient accumulation over micro-batches, bf16 autocast on GPU, optional DeepSpeed ZeRO, and
checkpoints that a restarted trainer resumes from."""

from __future__ import annotations

import copy
import json
import math
import os
import shutil
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch

from envsched_pipeline.run import (
    AGGREGATIONS,
    DEFAULT_CLIP_EPS,
    DEFAULT_SAMPLER_CAP,
    LOSS_DENOMINATORS,
    SAMPLER_CORRECTIONS,
    clip_high_problem,
    dual_clip_problem,
)
from trainer import ranks
from trainer.grpo import group_advantages
from trainer.loss import SAMPLER_STATS, clipped_step, grpo_loss, sampler_weights, token_logprobs


@dataclass
class GRPOConfig:
    lr: float = 1e-6
    weight_decay: float = 0.0
    clip_eps: float = DEFAULT_CLIP_EPS
    clip_eps_high: float | None = None  # the upper clip range alone (DAPO's clip-higher); None = clip_eps
    dual_clip: float = 0.0  # dual-clip PPO bound c > 1 for negative advantages; 0 = off (trainer.loss)
    # the correction for the sampler's log-probabilities differing from the trainer's (trainer.loss
    # sampler_weights): truncate | mask | off, and the weights' cap
    sampler_correction: str = "truncate"
    sampler_cap: float = DEFAULT_SAMPLER_CAP
    kl_coef: float = 0.0  # no KL by default; > 0 keeps a frozen reference copy
    aggregation: str = "token-mean"  # token-mean | seq-mean (see trainer.loss)
    # informative: the mean is over the sequences with a non-zero advantage; batch: over the whole
    # batch, zero-advantage sequences included (they add no gradient, only to the denominator)
    loss_denominator: str = "informative"
    micro_batch: int = 4  # sequences per forward/backward (gradient accumulation over the batch)
    epochs: int = 1  # passes over the batch per step (ratio != 1 only from the second pass)
    grad_clip: float = 1.0
    max_new_tokens: int = 256
    temperature: float = 1.0
    max_actions: int = 40  # the paper's setting
    max_context: int = 16384
    activation_checkpointing: bool = False  # recompute layer activations in the backward pass
    checkpoint_every: int = 20
    deepspeed: bool = (
        False  # use DeepSpeed ZeRO-2 with a config generated from this one (trainer.distributed)
    )
    world_size: int = 1
    sequences_per_step: int = 512

    def __post_init__(self):
        if problem := dual_clip_problem(self.dual_clip):
            raise ValueError(f"trainer setting dual_clip: {problem}")
        if problem := clip_high_problem(self.clip_eps, self.clip_eps_high):
            raise ValueError(f"trainer setting clip_eps_high: {problem}")
        if not self.sampler_cap > 1:
            raise ValueError(f"trainer setting sampler_cap: must be > 1, got {self.sampler_cap}")
        for name, allowed in (
            ("aggregation", AGGREGATIONS),
            ("loss_denominator", LOSS_DENOMINATORS),
            ("sampler_correction", SAMPLER_CORRECTIONS),
        ):
            if getattr(self, name) not in allowed:
                raise ValueError(
                    f"trainer setting {name}: {getattr(self, name)!r} is not one of {', '.join(allowed)}"
                )

    @classmethod
    def from_dict(cls, d: dict) -> GRPOConfig:
        known = set(cls.__dataclass_fields__)
        return cls(**{k: v for k, v in (d or {}).items() if k in known})


def micro_batches(rows: list[int], lengths: list[int], size: int) -> list[list[int]]:
    """``rows`` (sequence indices) in micro-batches of ``size``, shortest sequences together: a
    micro-batch is padded to its longest sequence, and agent episodes' lengths vary by tens of
    times, so grouping like lengths leaves the least padding. The step's gradient does not depend
    on the grouping (each micro-batch's loss is weighted by its share of the step's tokens or
    sequences), to float rounding."""
    order = sorted(rows, key=lambda j: (lengths[j], j))
    return [order[s : s + size] for s in range(0, len(order), size)]


def padding_fraction(micro: list[list[int]], lengths: list[int]) -> float:
    """The share of the update's token positions that are padding (each micro-batch padded to its
    longest sequence)."""
    padded = sum(len(mb) * max(lengths[j] for j in mb) for mb in micro if mb)
    return 1.0 - sum(lengths[j] for mb in micro for j in mb) / padded if padded else 0.0


def sampler_metrics(sums: dict) -> dict:
    """The step's numbers of the sampler correction from ``sampler_weights``'s sums: over the trained
    policy tokens the sampler gave a log-probability for, the mean and largest |trainer - sampler|
    log-probability, KL(sampler || trainer), the mean weight and the share the correction changed;
    and the policy tokens without one (an engine that does not report them). NaN with no such token."""
    n = sums["tokens"]
    if n <= 0:
        nan = float("nan")
        means = dict.fromkeys(("sampler_logprob_diff", "sampler_kl", "sampler_weight_mean"), nan)
        return {
            **means,
            "sampler_logprob_diff_max": nan,
            "sampler_corrected_fraction": nan,
            "sampler_unknown_tokens": int(sums["unknown_tokens"]),
        }
    return {
        "sampler_logprob_diff": sums["abs_diff"] / n,
        "sampler_logprob_diff_max": sums["max_abs_diff"],
        "sampler_kl": sums["kl"] / n,
        "sampler_weight_mean": sums["weight"] / n,
        "sampler_corrected_fraction": sums["corrected"] / n,
        "sampler_unknown_tokens": int(sums["unknown_tokens"]),
    }


def checkpoint_activations(model) -> None:
    """Have ``model`` (a transformers model) recompute each decoder layer's activations in the
    backward pass instead of keeping them from the forward one. Generation runs in eval mode,
    where nothing is recomputed."""
    kwargs = {"use_reentrant": False}  # the reentrant variant needs inputs that require grad
    if hasattr(model, "activation_checkpointing_enable"):  # its name from transformers 5
        model.activation_checkpointing_enable(kwargs)
    else:
        model.gradient_checkpointing_enable(kwargs)


def out_of_memory(exc: BaseException, config: GRPOConfig, seqs: list[list[int]]) -> torch.OutOfMemoryError:
    """The update's out-of-memory error, saying what to change: each micro-batch holds
    ``config.micro_batch`` sequences padded to the longest (of ``seqs``, the step's), so a smaller
    micro-batch or recomputed activations (neither changes the weights the run trains) need less."""
    longest = max((len(q) for q in seqs), default=0)
    hint = "lower --micro-batch" + ("" if config.micro_batch > 1 else " (at 1 already)")
    if not config.activation_checkpointing:
        hint += " or add --activation-checkpointing"
    first = (str(exc).strip().splitlines() or [""])[0]
    return torch.OutOfMemoryError(
        f"the GRPO update ran out of GPU memory at micro-batch {config.micro_batch} (sequences of up to "
        f"{longest} tokens, activation checkpointing {'on' if config.activation_checkpointing else 'off'}); "
        f"{hint} and resume (the run trains the same weights). {first}"
    )


class GRPOTrainer:
    def __init__(self, model, tokenizer, config: GRPOConfig = GRPOConfig(), device: str = "cpu"):

        self.model, self.tok, self.config, self.device = model, tokenizer, config, device
        self.bf16 = device.startswith("cuda") and torch.cuda.is_bf16_supported()
        self.ref = None
        if config.kl_coef > 0:
            self.ref = copy.deepcopy(model).eval()
            for p in self.ref.parameters():
                p.requires_grad_(False)
        if config.activation_checkpointing:
            checkpoint_activations(model)
        self.ds_engine = None
        if config.deepspeed:
            import deepspeed  # lazy: the gpu extra only

            from trainer.distributed import zero_config  # imports this module: only when DeepSpeed is used

            self.ds_config = zero_config(config, config.world_size, config.sequences_per_step)
            self.ds_engine, self.optimizer, _, _ = deepspeed.initialize(
                model=model,
                model_parameters=[p for p in model.parameters() if p.requires_grad],
                config=self.ds_config,
            )
        else:
            self.optimizer = torch.optim.AdamW(
                model.parameters(),
                lr=config.lr,
                weight_decay=config.weight_decay,
                betas=(0.9, 0.999),
                eps=1e-8,
            )
        self.version = 0

    # ------------------------------------------------------------------ batching
    def _pad(self, seqs: list[list[int]], masks: list[list[int]]):

        width = max(len(s) for s in seqs)
        pad = self.tok.pad_token_id
        ids = torch.full((len(seqs), width), pad, dtype=torch.long)
        att = torch.zeros((len(seqs), width), dtype=torch.long)
        msk = torch.zeros((len(seqs), width), dtype=torch.float32)
        for j, (s, m) in enumerate(zip(seqs, masks, strict=True)):
            ids[j, : len(s)] = torch.tensor(s)
            att[j, : len(s)] = 1
            msk[j, : len(m)] = torch.tensor(m, dtype=torch.float32)
        return ids.to(self.device), att.to(self.device), msk.to(self.device)

    def _logprobs(self, model, ids, att, mask=None, entropy: list | None = None):
        """(B, T) log-probabilities of each token given its prefix, under the distribution the
        rollouts sample from (the logits over the sampling temperature). With a mask, the vocabulary
        projection runs only at the positions that predict policy tokens (the rest are 0): the
        (B, T, V) logits of a 150k vocabulary would dominate memory and time otherwise."""

        base, head = getattr(model, "model", None), getattr(model, "lm_head", None)
        temperature = self.config.temperature if self.config.temperature > 0 else 1.0  # 0: greedy
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=self.bf16):
            if mask is None or base is None or head is None or self.ds_engine is not None:
                logits = model(input_ids=ids, attention_mask=att, use_cache=False).logits
                if temperature != 1.0:
                    logits = logits.float() / temperature
                if entropy is not None and mask is not None:
                    with torch.no_grad():  # a measurement: no graph for the backward pass
                        logp = torch.log_softmax(logits[:, :-1].detach().float(), dim=-1)
                        ent = -(logp.exp() * logp).sum(-1)
                        entropy.append(float((ent * mask[:, 1:]).sum()))
                return token_logprobs(logits, ids)
            hidden = base(input_ids=ids, attention_mask=att, use_cache=False).last_hidden_state
            sel = mask[:, 1:] > 0
            logits = head(hidden[:, :-1][sel]).float()
            if temperature != 1.0:
                logits = logits / temperature
        logp = torch.log_softmax(logits, dim=-1)
        if entropy is not None:  # mean entropy of the policy's next-token distribution at its own tokens
            with torch.no_grad():  # a measurement: no graph for the backward pass
                entropy.append(float(-(logp.detach().exp() * logp.detach()).sum(-1).sum()))
        lp = logp.gather(-1, ids[:, 1:][sel].unsqueeze(-1)).squeeze(-1)
        out = torch.zeros(ids.shape, dtype=lp.dtype, device=lp.device)
        inner = out[:, 1:].clone()
        inner[sel] = lp
        out = torch.cat([out[:, :1], inner], dim=1)
        return out

    def _pad_values(self, values: list[list[float]], width: int) -> torch.Tensor:
        """Per-token values beside ``_pad``'s ids (right-padded with NaN, as unknown)."""
        out = torch.full((len(values), width), float("nan"), dtype=torch.float32)
        for j, v in enumerate(values):
            out[j, : len(v)] = torch.tensor(v, dtype=torch.float32)
        return out.to(self.device)

    def _before_update(
        self, micro, seqs, masks, sampler_logprobs, ent_sums: list | None = None, policy: bool = True
    ):
        """Per micro-batch (lists of sequence indices): the policy's log-probabilities before the
        update (``policy``), the reference's (with a KL term), the sampler correction's weights
        (given the sampler's log-probabilities), and the correction's sums over every micro-batch.
        Without ``policy`` only the reference's: the training pass gives the rest (``update``)."""
        old: dict[int, torch.Tensor] = {}
        ref: dict[int, torch.Tensor] = {}
        weights: dict[int, torch.Tensor] = {}
        sums = dict.fromkeys(SAMPLER_STATS, 0.0)
        if not policy and self.ref is None:
            return old, ref, weights, sums
        self.model.eval()
        with torch.no_grad():
            for k, mb in enumerate(micro):
                ids, att, msk = self._pad([seqs[j] for j in mb], [masks[j] for j in mb])
                if policy:
                    old[k] = self._logprobs(self.model, ids, att, msk, entropy=ent_sums).detach()
                    self._correct(k, old[k], mb, msk, sampler_logprobs, weights, sums)
                if self.ref is not None:
                    ref[k] = self._logprobs(self.ref, ids, att, msk).detach()
        return old, ref, weights, sums

    def _correct(self, k, old, mb, msk, sampler_logprobs, weights: dict, sums: dict) -> None:
        """Micro-batch ``k``'s sampler-correction weights into ``weights`` and its sums into ``sums``
        (nothing without the sampler's log-probabilities)."""
        if sampler_logprobs is None:
            return
        c = self.config
        drawn = self._pad_values([sampler_logprobs[j] for j in mb], old.shape[1])
        weights[k], st = sampler_weights(old, drawn, msk, c.sampler_correction, c.sampler_cap)
        for name in SAMPLER_STATS:
            sums[name] = max(sums[name], st[name]) if name == "max_abs_diff" else sums[name] + st[name]

    def sampler_gap(
        self, seqs: list[list[int]], masks: list[list[int]], sampler_logprobs: list[list[float]]
    ) -> dict:
        """How far the sampler's log-probabilities of these sequences' policy tokens are from this
        trainer's (``sampler_metrics``), without training: a check of an engine's numerics."""
        rows = [j for j in range(len(seqs)) if sum(masks[j]) > 0]
        micro = micro_batches(rows, [len(q) for q in seqs], self.config.micro_batch)
        return sampler_metrics(self._before_update(micro, seqs, masks, sampler_logprobs)[3])

    # ------------------------------------------------------------------ update
    def update(
        self,
        seqs: list[list[int]],
        masks: list[list[int]],
        rewards: np.ndarray,
        group_size: int,
        sampler_logprobs: list[list[float]] | None = None,
    ) -> dict:
        """One GRPO step. seqs/masks: per rollout, grouped consecutively (G per task); rewards: (n*G,);
        sampler_logprobs: per rollout, beside its tokens, the log-probability the sampler gave each
        policy token (NaN where unknown): the update weighs each token by the sampler correction
        (``sampler_correction``; trainer.loss.sampler_weights) and reports how far apart they were."""

        c = self.config
        if sampler_logprobs is not None:
            for j, (q, lps) in enumerate(zip(seqs, sampler_logprobs, strict=True)):
                if len(lps) != len(q):
                    raise ValueError(
                        f"sampler_logprobs[{j}] has {len(lps)} values for a sequence of {len(q)} tokens"
                    )
        t0 = time.perf_counter()
        adv = group_advantages(np.asarray(rewards, dtype=float).reshape(-1, group_size)).reshape(-1)
        # zero-advantage sequences carry no gradient: skip their compute entirely
        keep = [j for j in range(len(seqs)) if abs(adv[j]) > 1e-8 and sum(masks[j]) > 0]
        metrics = {
            "sequences": len(seqs),
            "trained_sequences": len(keep),
            "policy_tokens": int(sum(sum(m) for m in masks)),
            "loss": 0.0,
            "grad_norm": 0.0,
            "lr": self.optimizer.param_groups[0]["lr"],
            "clip_fraction": 0.0,
            "kl": 0.0,
            "approx_kl": 0.0,
            "entropy": float("nan"),
            "trained_tokens_per_second": 0.0,
            "padding_fraction": 0.0,
        }
        # data-parallel ranks (trainer/ranks.py): weights and the decision to train use the global
        # token count, so every rank joins the same collectives and the step equals one big update
        parallel = ranks.active() and self.ds_engine is None
        local_tokens = float(sum(sum(masks[j]) for j in keep))
        total_tokens = ranks.total(local_tokens) if parallel else local_tokens
        # the loss's denominator: the tokens (token-mean) or sequences (seq-mean) it averages over,
        # of the informative sequences or of the whole batch; one more collective only when needed
        token_mean, whole = c.aggregation == "token-mean", c.loss_denominator == "batch"
        if token_mean and not whole:
            denom = total_tokens
        else:
            here = (
                float(sum(sum(m) for m in masks)) if token_mean else float(len(seqs) if whole else len(keep))
            )
            denom = ranks.total(here) if parallel else here
        if total_tokens <= 0:
            metrics["seconds"] = time.perf_counter() - t0
            return metrics
        model = self.ds_engine or self.model
        lengths = [len(q) for q in seqs]
        micro = micro_batches(keep, lengths, c.micro_batch)
        metrics["padding_fraction"] = padding_fraction(micro, lengths)
        ent_sums: list[float] = []
        # one pass over the batch: the policy before the update is the one its training pass runs (the
        # optimizer steps after the last micro-batch), so that pass's log-probabilities, detached, are
        # the old ones and no pass of their own is needed; a second epoch needs them kept from before
        fused = c.epochs == 1
        old, ref, weights, sampler = self._before_update(
            micro, seqs, masks, sampler_logprobs, ent_sums, policy=not fused
        )
        self.model.train()
        losses, norms, clips, kls, approx = [], [], [], [], []
        skipped = 0
        for _ in range(c.epochs):
            if self.ds_engine is None:
                self.optimizer.zero_grad(set_to_none=True)
            step_loss = 0.0
            for k, mb in enumerate(micro):
                ids, att, msk = self._pad([seqs[j] for j in mb], [masks[j] for j in mb])
                lp = self._logprobs(model, ids, att, msk, entropy=ent_sums if fused else None)
                if fused:
                    old[k] = lp.detach()
                    self._correct(k, old[k], mb, msk, sampler_logprobs, weights, sampler)
                a = torch.tensor(adv[mb], dtype=torch.float32, device=self.device)
                loss, st = grpo_loss(
                    lp,
                    old[k],
                    a,
                    msk,
                    c.clip_eps,
                    c.kl_coef,
                    ref.get(k),
                    c.aggregation,
                    c.dual_clip,
                    clip_eps_high=c.clip_eps_high,
                    token_weights=weights.get(k),
                )
                # scale so the accumulated gradient equals the full-batch aggregation
                weight = (msk.sum().item() if token_mean else len(mb)) / denom
                scaled = loss * weight
                if self.ds_engine is not None:
                    # the step ends after the last micro-batch, however many there are; the loss is
                    # already weighted by token share, so DeepSpeed must not divide it again
                    self.ds_engine.set_gradient_accumulation_boundary(k == len(micro) - 1)
                    self.ds_engine.backward(scaled, scale_wrt_gas=False)
                else:
                    scaled.backward()
                step_loss += float(scaled.detach())
                clips.append(st["clip_fraction"])
                kls.append(st["kl"])
                with torch.no_grad():  # k3 estimate of KL(old || new) at the policy's tokens
                    d = (old[k] - lp).float() * msk
                    approx.append(float(((torch.exp(d) - d - 1.0) * msk).sum() / msk.sum().clamp_min(1.0)))
            if self.ds_engine is not None:
                self.ds_engine.step()
                norms.append(float(self.ds_engine.get_global_grad_norm() or 0.0))
            else:
                if parallel:
                    ranks.sum_gradients(self.model)
                    step_loss = ranks.total(step_loss)
                norm = clipped_step(self.optimizer, self.model.parameters(), c.grad_clip)
                if math.isfinite(norm):
                    norms.append(norm)
                else:  # this epoch's step was not applied (non-finite gradient)
                    skipped += 1
            losses.append(step_loss)
        self.version += 1
        metrics.update(
            loss=float(np.mean(losses)),
            grad_norm=float(np.mean(norms)) if norms else float("nan"),
            skipped_updates=skipped,
            epoch_losses=losses,
            clip_fraction=float(np.mean(clips)),
            kl=float(np.mean(kls)),
            approx_kl=float(np.mean(approx)),
            entropy=float(sum(ent_sums) / max(local_tokens, 1.0)),
            seconds=time.perf_counter() - t0,
            **sampler_metrics(sampler),
        )
        metrics["trained_tokens_per_second"] = total_tokens * c.epochs / max(metrics["seconds"], 1e-9)
        if skipped == c.epochs:
            # every epoch's gradient was non-finite: the weights are unchanged, but the batch taught
            # nothing and a run that keeps doing this is broken, so the step fails (and says why)
            raise FloatingPointError(
                f"GRPO update skipped: the gradient was not finite in all {c.epochs} epoch(s) "
                f"(loss {metrics['loss']}); the weights were left unchanged"
            )
        return metrics

    # ------------------------------------------------------------------ checkpoints
    def save(self, path: Path, step: int, tokenizer=None) -> None:
        """Atomically write model + optimizer + meta (+ the tokenizer, so vLLM and ``from_pretrained``
        can load the folder on their own) to ``path`` (a folder)."""

        path = Path(path)
        tmp = path.with_name(path.name + f".tmp{os.getpid()}")
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        self.model.save_pretrained(tmp, safe_serialization=True)
        if tokenizer is not None:
            tokenizer.save_pretrained(tmp)
        if self.ds_engine is None:
            torch.save(self.optimizer.state_dict(), tmp / "optimizer.pt")
        (tmp / "trainer.json").write_text(
            json.dumps({"step": step, "version": self.version, "config": asdict(self.config)})
        )
        old = path.with_name(path.name + ".old")
        if path.exists():
            os.replace(path, old)
        os.replace(tmp, path)
        shutil.rmtree(old, ignore_errors=True)

    def use_lr(self, lr: float) -> None:
        """Train the next updates at ``lr`` (the run's schedule gives each step its own rate)."""
        for group in self.optimizer.param_groups:
            group["lr"] = lr

    def load_optimizer(self, path: Path) -> None:
        """The optimizer's moments and the policy version from a checkpoint; the learning rate and
        weight decay stay this trainer's settings (the saved state carries those it ran with, so a
        run resumed with another `lr` trained on at the old one)."""
        opt = Path(path) / "optimizer.pt"
        if opt.exists() and self.ds_engine is None:
            self.optimizer.load_state_dict(torch.load(opt, map_location=self.device, weights_only=False))
            for group in self.optimizer.param_groups:
                group["lr"], group["weight_decay"] = self.config.lr, self.config.weight_decay
        meta = Path(path) / "trainer.json"
        if meta.exists():
            self.version = int(json.loads(meta.read_text()).get("version", 0))

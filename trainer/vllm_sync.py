"""vLLM on its supported public API: generation with ``vllm.LLM``, weight sync after each update
through a *worker extension* and ``LLM.collective_rpc`` (no private engine attributes), and
sleep / wake for a colocated trainer.

* :func:`sampling_kwargs` maps the agent loop's settings to ``SamplingParams`` for the Qwen3
  tool-call template (stop at ``<|im_end|>``; keep special tokens so ``<tool_call>`` blocks parse).
* :func:`weight_items` is the (name, tensor) list vLLM's ``load_weights`` expects from a
  transformers Qwen3 (tied embeddings: ``lm_head.weight`` only when it is a separate tensor).
* :class:`WeightSyncExtension` is loaded *inside* each vLLM worker (``worker_extension_cls``); the
  trainer calls its methods by name through ``collective_rpc``: ``update_weights_from_ipc`` takes
  CUDA IPC handles (colocated on one GPU: no copy through the host), ``update_weights_from_tensors``
  takes tensors (same process, tests).

Memory when colocated: build the engine with ``enable_sleep_mode=True`` and a modest
``gpu_memory_utilization`` (0.3-0.5); the trainer calls ``sleep(level=1)`` before its update (vLLM
offloads its weights and drops the KV cache, freeing memory for activations and optimizer state)
and ``wake_up()`` + the weight sync before the next rollouts.
"""

from __future__ import annotations

IM_END_ID = 151645  # Qwen3 <|im_end|>


def sampling_kwargs(
    max_new_tokens: int,
    temperature: float,
    top_p: float = 1.0,
    seed: int | None = None,
    logprobs: int | None = None,
) -> dict:
    """Keyword arguments of ``vllm.SamplingParams`` for one assistant turn; ``logprobs=0`` asks for
    the sampled token's log-probability alone."""
    kw = {
        "max_tokens": int(max_new_tokens),
        "temperature": float(temperature),
        "top_p": float(top_p),
        "stop_token_ids": [IM_END_ID],
        "skip_special_tokens": False,
        "include_stop_str_in_output": True,
    }
    if seed is not None:
        kw["seed"] = int(seed)
    if logprobs is not None:
        kw["logprobs"] = int(logprobs)
    return kw


def weight_items(model) -> list[tuple[str, object]]:
    """The policy's parameters and buffers as vLLM's ``load_weights`` takes them: transformers
    names, detached; a tied ``lm_head.weight`` is left out (vLLM ties it itself)."""
    tied = getattr(getattr(model, "config", None), "tie_word_embeddings", False)
    out = []
    for name, tensor in model.state_dict().items():
        if tied and name == "lm_head.weight":
            continue
        out.append((name, tensor.detach()))
    return out


def ipc_handles(items: list[tuple[str, object]]) -> dict:
    """CUDA IPC handles of the tensors (GPU only): {name: (rebuild function, args)}."""
    from torch.multiprocessing.reductions import reduce_tensor  # GPU path only

    return {name: reduce_tensor(t.contiguous()) for name, t in items}


class WeightSyncExtension:
    """Mixed into vLLM's worker (``LLM(worker_extension_cls="trainer.vllm_sync.WeightSyncExtension")``);
    ``self.model_runner`` is the worker's own."""

    def update_weights_from_tensors(self, items: list[tuple[str, object]]) -> int:
        self.model_runner.model.load_weights(weights=items)
        return len(items)

    def update_weights_from_ipc(self, handles: dict) -> int:
        import torch  # inside the vLLM worker

        device = torch.device(f"cuda:{torch.cuda.current_device()}")
        items = []
        for name, (rebuild, args) in handles.items():
            args = list(args)
            args[6] = device.index  # the tensor lives on this worker's device
            items.append((name, rebuild(*args)))
        self.model_runner.model.load_weights(weights=items)
        torch.cuda.synchronize()
        return len(items)

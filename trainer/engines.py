"""Rollout engines behind one interface.

Token engines (``hf``, ``vllm``, ``scripted``) implement
``generate(prompts: list[list[int]], max_new_tokens, temperature) -> list[list[int]]`` and keep the
trajectory in tokens (what the GRPO update trains on). Those that can say how likely each token they
sampled was (``hf``, ``vllm``) also implement ``sample(...)``, the same call returning each reply's
tokens with their log-probabilities under the distribution they were drawn from (temperature
applied): the update compares them with its own to correct for the sampler's numerics
(:mod:`trainer.update`, the sampler correction). The ``openai`` engine is a message engine:
``chat(messages, tools) -> assistant text``, for evaluation or curation runs against any
OpenAI-compatible server (no weight update). vllm is imported lazily and only on GPU machines.
"""

from __future__ import annotations

import json

from trainer.vllm_sync import ipc_handles, sampling_kwargs, weight_items


class ScriptedEngine:
    """Replays fixed assistant texts (tests of the agent loop). Cycles per episode index."""

    kind = "tokens"

    def __init__(self, tokenizer, scripts: list[list[str]]):
        self.tok = tokenizer
        self.scripts = scripts
        self.calls: dict[int, int] = {}

    def reseed(self, seed: int) -> None:
        """Nothing to seed: the scripts are fixed."""

    def generate(self, prompts, max_new_tokens=256, temperature=1.0, episode_ids=None):
        out = []
        for j, _ in enumerate(prompts):
            e = episode_ids[j] if episode_ids is not None else j
            k = self.calls.get(e, 0)
            script = self.scripts[e % len(self.scripts)]
            text = script[k] if k < len(script) else "done"
            self.calls[e] = k + 1
            out.append(self.tok.encode(text + "<|im_end|>", add_special_tokens=False)[:max_new_tokens])
        return out


class HFEngine:
    """transformers ``generate`` (CPU or GPU), sampling, left-padded batches."""

    kind = "tokens"

    def __init__(self, model, tokenizer, device: str = "cpu", batch_size: int = 16):
        self.model, self.tok, self.device, self.batch_size = model, tokenizer, device, batch_size

    def reseed(self, seed: int) -> None:
        """Sample from ``seed`` on: the same episodes in the same batches sample the same tokens."""
        import torch  # engines without torch (openai, scripted) must not need it

        torch.manual_seed(seed)

    def generate(self, prompts, max_new_tokens=256, temperature=1.0, episode_ids=None):
        """Each reply's tokens (the same draws as ``sample``'s; no log-probability computed)."""
        return [tokens for tokens, _ in self._draw(prompts, max_new_tokens, temperature, keep_logprobs=False)]

    def sample(self, prompts, max_new_tokens=256, temperature=1.0, episode_ids=None):
        """Each reply's tokens and the log-probability of each under the distribution it was drawn
        from (the logits over the temperature; ``top_k``/``top_p`` filter nothing here)."""
        return self._draw(prompts, max_new_tokens, temperature, keep_logprobs=True)

    def _draw(self, prompts, max_new_tokens, temperature, keep_logprobs: bool):
        import torch  # engines without torch (openai, scripted) must not need it

        out: list[tuple[list[int], list[float]]] = []
        pad = self.tok.pad_token_id
        eos = self.tok.convert_tokens_to_ids("<|im_end|>")
        self.model.eval()
        for s in range(0, len(prompts), self.batch_size):
            chunk = prompts[s : s + self.batch_size]
            width = max(len(p) for p in chunk)
            ids = torch.full((len(chunk), width), pad, dtype=torch.long)
            att = torch.zeros((len(chunk), width), dtype=torch.long)
            for j, p in enumerate(chunk):
                ids[j, width - len(p) :] = torch.tensor(p)
                att[j, width - len(p) :] = 1
            # the sampler's log-probabilities cost a log-softmax over the vocabulary per token
            picked = _SampledLogprobs(temperature) if keep_logprobs else None
            with torch.no_grad():
                gen = self.model.generate(
                    input_ids=ids.to(self.device),
                    attention_mask=att.to(self.device),
                    max_new_tokens=max_new_tokens,
                    do_sample=temperature > 0,
                    temperature=max(temperature, 1e-5),
                    top_p=1.0,
                    top_k=0,
                    eos_token_id=eos,
                    pad_token_id=pad,
                    logits_processor=[picked] if picked else None,
                )
            logprobs = picked.of(gen[:, width:]) if picked else None
            for j in range(len(chunk)):
                new = gen[j, width:].tolist()
                if eos in new:
                    new = new[: new.index(eos) + 1]
                else:
                    while new and new[-1] == pad:
                        new.pop()
                out.append((new, logprobs[j, : len(new)].tolist() if picked else []))
        return out


class _SampledLogprobs:
    """A logits processor that leaves the logits alone and keeps, at each generation step, the
    log-probability the sampler gives the token it then draws. transformers runs the processors
    given to ``generate`` before its temperature warper, so the logits it sees are the model's;
    the token drawn at one step is the last input of the next (the last step's: ``of``)."""

    def __init__(self, temperature: float):
        self.temperature = max(float(temperature), 1e-5)  # as HFEngine passes it to generate
        self.steps: list = []
        self.last = None

    def __call__(self, input_ids, scores):
        import torch  # only where an HFEngine runs

        if self.last is not None:
            self.steps.append(self.last.gather(-1, input_ids[:, -1:]).squeeze(-1))
        self.last = torch.log_softmax(scores.float() / self.temperature, dim=-1)
        return scores

    def of(self, new_tokens):
        """(batch, generated) log-probabilities of ``new_tokens``, the tokens ``generate`` added."""
        import torch  # only where an HFEngine runs

        steps = list(self.steps)
        if self.last is not None and len(steps) < new_tokens.shape[1]:
            steps.append(self.last.gather(-1, new_tokens[:, len(steps) : len(steps) + 1]).squeeze(-1))
        if not steps:
            return torch.zeros(new_tokens.shape)
        return torch.stack(steps, dim=1).cpu()


class RequestSeeds:
    """A seed for each request of an engine that seeds requests, not itself (vLLM, an OpenAI-compatible
    server): after ``reseed(seed)`` the n-th request gets a seed derived from ``seed`` and n, so the
    same requests after the same reseed get the same seeds; before any reseed, none (the engine's
    own sampling)."""

    seed: int | None = None
    requests = 0

    def reseed(self, seed: int) -> None:
        self.seed, self.requests = int(seed), 0

    def next_seed(self) -> int | None:
        if self.seed is None:
            return None
        self.requests += 1
        return (self.seed * 1_000_003 + self.requests) % (2**63)


class VLLMEngine(RequestSeeds):
    """vLLM in-process engine (GPU) on its public API (see :mod:`trainer.vllm_sync`): generation with
    ``vllm.LLM``, weights pushed from the torch policy after each update through a worker extension
    and ``collective_rpc``, optional sleep mode when colocated with the trainer. Not run on a GPU in
    this repository (none was available); covered on CPU up to the ``LLM`` object."""

    kind = "tokens"

    def __init__(
        self,
        model_path: str,
        gpu_memory_utilization: float = 0.4,
        tensor_parallel_size: int = 1,
        dtype: str = "bfloat16",
        sleep_mode: bool = True,
        llm=None,
    ):
        self.sleep_mode = sleep_mode
        if llm is None:
            from vllm import LLM  # the gpu extra only

            llm = LLM(
                model=model_path,
                # the log-probability of each sampled token under the distribution it was drawn from
                # (temperature applied), for the update's sampler correction; the default is the raw one
                logprobs_mode="processed_logprobs",
                gpu_memory_utilization=gpu_memory_utilization,
                tensor_parallel_size=tensor_parallel_size,
                dtype=dtype,
                enable_prefix_caching=True,
                enable_sleep_mode=sleep_mode,
                worker_extension_cls="trainer.vllm_sync.WeightSyncExtension",
            )
        self.llm = llm
        self.asleep = False

    def generate(self, prompts, max_new_tokens=256, temperature=1.0, episode_ids=None):
        """Each reply's tokens (no log-probabilities asked of vLLM)."""
        outs = self._draw(prompts, max_new_tokens, temperature, logprobs=None)
        return [list(o.outputs[0].token_ids) for o in outs]

    def sample(self, prompts, max_new_tokens=256, temperature=1.0, episode_ids=None):
        """Each reply's tokens and vLLM's log-probability of each (``logprobs=0``: the sampled token's
        alone; processed, so under the distribution it was drawn from)."""
        outs = self._draw(prompts, max_new_tokens, temperature, logprobs=0)
        return [sampled_logprobs(o.outputs[0]) for o in outs]

    def _draw(self, prompts, max_new_tokens, temperature, logprobs: int | None):
        from vllm import SamplingParams  # the gpu extra only
        from vllm.inputs import TokensPrompt  # the gpu extra only

        self.wake()
        if self.seed is None:
            params = SamplingParams(**sampling_kwargs(max_new_tokens, temperature, logprobs=logprobs))
        else:  # each prompt its own seed (RequestSeeds)
            params = [
                SamplingParams(
                    **sampling_kwargs(max_new_tokens, temperature, seed=self.next_seed(), logprobs=logprobs)
                )
                for _ in prompts
            ]
        return self.llm.generate([TokensPrompt(prompt_token_ids=p) for p in prompts], params, use_tqdm=False)

    def sleep(self) -> None:
        """Free vLLM's GPU memory (weights offloaded, KV cache dropped) while the trainer updates."""
        if self.sleep_mode and not self.asleep:
            self.llm.sleep(level=1)
            self.asleep = True

    def wake(self) -> None:
        if self.asleep:
            self.llm.wake_up()
            self.asleep = False

    def sync_weights(self, model) -> int:
        """Load the updated torch weights into every vLLM worker; returns the tensors sent."""
        self.wake()
        items = weight_items(model)
        on_gpu = items and getattr(items[0][1], "is_cuda", False)
        if on_gpu:
            counts = self.llm.collective_rpc("update_weights_from_ipc", args=(ipc_handles(items),))
        else:
            counts = self.llm.collective_rpc("update_weights_from_tensors", args=(items,))
        self.llm.reset_prefix_cache()  # cached prefixes were computed with the old weights
        return int(counts[0]) if counts else 0


def sampled_logprobs(completion) -> tuple[list[int], list[float]]:
    """A vLLM completion's tokens and each one's log-probability (NaN where vLLM gave none)."""
    tokens = list(completion.token_ids)
    given = getattr(completion, "logprobs", None) or []
    logprobs = []
    for k, token in enumerate(tokens):
        at = given[k] if k < len(given) else None
        entry = at.get(token) if at is not None else None
        logprobs.append(float(entry.logprob) if entry is not None else float("nan"))
    return tokens, logprobs


class OpenAIEngine(RequestSeeds):
    """Any OpenAI-compatible chat server (evaluation / curation; no weight update)."""

    kind = "messages"

    def __init__(self, base_url: str, model: str, api_key: str = "none", timeout: float = 60.0):
        from openai import OpenAI  # half a second of imports a language model's step process never needs

        self.client = OpenAI(base_url=base_url, api_key=api_key or "none", timeout=timeout)
        self.model = model

    def chat(self, messages: list[dict], tools: list[dict], max_new_tokens=512, temperature=1.0) -> str:
        # the API's `seed` (RequestSeeds): servers that honour it sample the same reply again
        seed = self.next_seed()
        extra = {} if seed is None else {"seed": seed}
        resp = self.client.chat.completions.create(
            model=self.model,
            messages=messages,
            tools=tools or None,
            max_tokens=max_new_tokens,
            temperature=temperature,
            **extra,
        )
        msg = resp.choices[0].message
        text = msg.content or ""
        for c in msg.tool_calls or []:
            try:
                args = json.loads(c.function.arguments or "{}")
            except json.JSONDecodeError:
                args = c.function.arguments
            text += (
                "\n<tool_call>\n"
                + json.dumps({"name": c.function.name, "arguments": args})
                + "\n</tool_call>"
            )
        return text

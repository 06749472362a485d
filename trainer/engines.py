"""Rollout engines behind one interface.

Token engines (``hf``, ``vllm``, ``scripted``) implement
``generate(prompts: list[list[int]], max_new_tokens, temperature) -> list[list[int]]`` and keep the
trajectory in tokens (what the GRPO update trains on). The ``openai`` engine is a message engine:
``chat(messages, tools) -> assistant text``, for evaluation or curation runs against any
OpenAI-compatible server (no weight update). vllm is imported lazily and only on GPU machines.
"""

from __future__ import annotations

import json

from openai import OpenAI


class ScriptedEngine:
    """Replays fixed assistant texts (tests of the agent loop). Cycles per episode index."""

    kind = "tokens"

    def __init__(self, tokenizer, scripts: list[list[str]]):
        self.tok = tokenizer
        self.scripts = scripts
        self.calls: dict[int, int] = {}

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

    def generate(self, prompts, max_new_tokens=256, temperature=1.0, episode_ids=None):
        import torch  # engines without torch (openai, scripted) must not need it

        out: list[list[int]] = []
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
                )
            for j in range(len(chunk)):
                new = gen[j, width:].tolist()
                if eos in new:
                    new = new[: new.index(eos) + 1]
                else:
                    while new and new[-1] == pad:
                        new.pop()
                out.append(new)
        return out


class VLLMEngine:
    """vLLM in-process engine (GPU). Weights are pushed from the torch policy after each update.
    Untested on a GPU in this repository's CI (no GPU there); see README."""

    kind = "tokens"

    def __init__(
        self,
        model_path: str,
        gpu_memory_utilization: float = 0.4,
        tensor_parallel_size: int = 1,
        dtype: str = "bfloat16",
    ):
        from vllm import LLM  # lazy: the gpu extra only

        self.llm = LLM(
            model=model_path,
            gpu_memory_utilization=gpu_memory_utilization,
            tensor_parallel_size=tensor_parallel_size,
            dtype=dtype,
            enable_prefix_caching=True,
        )

    def generate(self, prompts, max_new_tokens=256, temperature=1.0, episode_ids=None):
        from vllm import SamplingParams  # the gpu extra only
        from vllm.inputs import TokensPrompt  # the gpu extra only

        params = SamplingParams(max_tokens=max_new_tokens, temperature=temperature, stop_token_ids=[151645])
        outs = self.llm.generate([TokensPrompt(prompt_token_ids=p) for p in prompts], params, use_tqdm=False)
        return [list(o.outputs[0].token_ids) for o in outs]

    def sync_weights(self, model) -> None:
        """Load the updated torch weights into the vLLM workers."""
        state = ((name, p.detach()) for name, p in model.state_dict().items())
        runner = self.llm.llm_engine.model_executor.driver_worker.model_runner
        runner.model.load_weights(state)


class OpenAIEngine:
    """Any OpenAI-compatible chat server (evaluation / curation; no weight update)."""

    kind = "messages"

    def __init__(self, base_url: str, model: str, api_key: str = "none", timeout: float = 60.0):

        self.client = OpenAI(base_url=base_url, api_key=api_key or "none", timeout=timeout)
        self.model = model

    def chat(self, messages: list[dict], tools: list[dict], max_new_tokens=512, temperature=1.0) -> str:
        resp = self.client.chat.completions.create(
            model=self.model,
            messages=messages,
            tools=tools or None,
            max_tokens=max_new_tokens,
            temperature=temperature,
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

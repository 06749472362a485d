"""The multi-turn tool-calling agent loop, run over many episodes in lock-step batches.

Each round, every active episode's conversation so far is sent to the engine in one batch; each
reply is parsed (optional ``<think>``, ``<tool_call>`` blocks); tool calls run in the episode's
sandboxed environment and come back as tool messages; a parse error or an unknown tool becomes an
error observation; a reply with no tool call ends the user turn (multi-turn pools then present the
next user message) and, after the last turn, the episode is verified. At most ``max_actions`` tool
calls per episode (the paper's 40), then the episode is truncated and verified as it stands.

Token engines keep the trajectory as token ids with a mask that is 1 exactly on the tokens the
policy generated — what the GRPO update trains on — and, beside them, the log-probability the
sampler gave each generated token (NaN where the engine gives none, 0 on the other tokens).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from trainer import chat

NO_LOGPROB = float("nan")  # a generated token whose sampler log-probability is not known


@dataclass
class Episode:
    task_id: str
    rollout: int
    session: object
    ids: list[int] = field(default_factory=list)
    mask: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)  # the sampler's, beside ids (module docstring)
    messages: list[dict] = field(default_factory=list)
    tools: list[dict] = field(default_factory=list)
    actions: int = 0
    turns: int = 0
    parse_errors: int = 0
    unknown_tools: int = 0
    done: bool = False
    truncated: bool = False
    answer: str = ""
    result: dict = field(default_factory=dict)
    tool_log: list[dict] = field(default_factory=list)

    @property
    def generated_tokens(self) -> int:
        return sum(self.mask)


class AgentLoop:
    def __init__(
        self,
        engine,
        tokenizer=None,
        max_actions: int = 40,
        max_new_tokens: int = 256,
        temperature: float = 1.0,
        max_context: int = 16384,
        system: str = chat.DEFAULT_SYSTEM,
    ):
        self.engine, self.tok = engine, tokenizer
        self.max_actions, self.max_new_tokens, self.temperature = max_actions, max_new_tokens, temperature
        self.max_context, self.system = max_context, system
        self.tokens = getattr(engine, "kind", "tokens") == "tokens"
        if self.tokens and tokenizer is None:
            raise ValueError("token engines need a tokenizer")

    # ------------------------------------------------------------------ conversation building
    def _append(self, ep: Episode, text: str, trainable: bool) -> None:
        if self.tokens:
            ids = self.tok.encode(text, add_special_tokens=False)
            ep.ids += ids
            ep.mask += [1 if trainable else 0] * len(ids)
            ep.logprobs += [0.0 if not trainable else NO_LOGPROB] * len(ids)

    def _start(self, ep: Episode) -> None:
        first = ep.session.reset()
        if first is None:  # the environment failed to start: verify (gives the recorded error)
            ep.result = ep.session.finish(None)
            ep.done = True
            return
        ep.tools = first.get("tools") or []
        ep.messages = [
            {"role": "system", "content": self.system},
            {"role": "user", "content": first["observation"]},
        ]
        self._append(
            ep,
            chat.render_system(ep.tools, self.system)
            + chat.render_user(first["observation"])
            + chat.assistant_header(),
            False,
        )
        ep.turns = 1

    def _finish(self, ep: Episode, answer: str | None) -> None:
        ep.answer = answer or ""
        ep.result = ep.session.finish(answer)
        ep.done = True

    def _observe(self, ep: Episode, text: str) -> None:
        parsed = chat.parse_assistant(text)
        ep.messages.append({"role": "assistant", "content": text})
        if parsed.errors or parsed.tool_calls:
            results = []
            for err in parsed.errors:
                ep.parse_errors += 1
                ep.actions += 1
                results.append(
                    f'Error: {err}. Use <tool_call>{{"name": ..., "arguments": {{...}}}}</tool_call>.'
                )
            for call in parsed.tool_calls:
                if ep.actions >= self.max_actions:
                    break
                ep.actions += 1
                obs = ep.session.step(call)
                obs = obs if isinstance(obs, str) else str(obs)
                if obs.startswith("Error: unknown tool"):
                    ep.unknown_tools += 1
                ep.tool_log.append(
                    {"name": call["name"], "arguments": call["arguments"], "output": obs[:2000]}
                )
                results.append(obs)
            for r in results:
                ep.messages.append({"role": "tool", "content": r})
            if ep.actions >= self.max_actions:
                ep.truncated = True
                self._finish(ep, parsed.content)
                return
            self._append(ep, chat.render_tool_results(results) + chat.assistant_header(), False)
            return
        # no tool call: the answer to this user turn
        nxt = ep.session.end_turn(parsed.content)
        if nxt:
            ep.turns += 1
            ep.messages.append({"role": "user", "content": nxt})
            self._append(ep, chat.render_user(nxt) + chat.assistant_header(), False)
        else:
            self._finish(ep, parsed.content)

    def _sample(
        self, prompts: list[list[int]], episode_ids: list[int]
    ) -> list[tuple[list[int], list[float]]]:
        """The engine's replies with the sampler's log-probabilities, NaN for an engine without them."""
        if hasattr(self.engine, "sample"):
            return self.engine.sample(prompts, self.max_new_tokens, self.temperature, episode_ids=episode_ids)
        outs = self.engine.generate(prompts, self.max_new_tokens, self.temperature, episode_ids=episode_ids)
        return [(new, [NO_LOGPROB] * len(new)) for new in outs]

    # ------------------------------------------------------------------ the loop
    def run(self, episodes: list[Episode], log=None) -> list[Episode]:
        for ep in episodes:
            self._start(ep)
        rounds = 0
        while True:
            active = [e for e in episodes if not e.done]
            if not active:
                break
            rounds += 1
            over = [e for e in active if self.tokens and len(e.ids) + self.max_new_tokens > self.max_context]
            for e in over:  # context exhausted: verify as it stands
                e.truncated = True
                self._finish(e, "")
            active = [e for e in active if not e.done]
            if not active:
                break
            if self.tokens:
                outs = self._sample([e.ids for e in active], [episodes.index(e) for e in active])
                eos = self.tok.convert_tokens_to_ids(chat.IM_END)
                texts = []
                for e, (new, logprobs) in zip(active, outs, strict=True):
                    e.ids += new
                    e.mask += [1] * len(new)
                    e.logprobs += logprobs
                    if not new or new[-1] != eos:  # cut by max_new_tokens: close the turn (not trained on)
                        e.ids.append(eos)
                        e.mask.append(0)
                        e.logprobs.append(0.0)
                    nl = self.tok.encode("\n", add_special_tokens=False)
                    e.ids += nl
                    e.mask += [0] * len(nl)
                    e.logprobs += [0.0] * len(nl)
                    texts.append(self.tok.decode(new, skip_special_tokens=False))
            else:
                texts = [
                    self.engine.chat(
                        _api_messages(e.messages), e.tools, self.max_new_tokens, self.temperature
                    )
                    for e in active
                ]
            for e, text in zip(active, texts, strict=True):
                self._observe(e, text)
            if log:
                log(
                    f"agent round {rounds}: {sum(not e.done for e in episodes)} of {len(episodes)} episodes active"
                )
        return episodes


def _api_messages(messages: list[dict]) -> list[dict]:
    """Our transcript as OpenAI chat messages (tool results as user turns, like Qwen3's template)."""
    out = []
    for m in messages:
        if m["role"] == "tool":
            out.append({"role": "user", "content": f"<tool_response>\n{m['content']}\n</tool_response>"})
        else:
            out.append({"role": m["role"], "content": m["content"]})
    return out

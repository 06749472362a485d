"""The pointer policy (torch): picks a tool (or stop), then each required argument as a pointer
to a candidate value (an instruction token or a value from an earlier tool output).

    instruction tokens --(hashed word + shape + position embeddings, 2 transformer layers)--> C
    state h_0 = f(mean C); after each action h_{k+1} = GRU(h_k, [tool + arguments, output words])
    tool logits   = (W_t z_k) . tool_vec_j,  z_k = MLP([h_k, attention(h_k, C)]); one stop logit
    argument p    = (W_c q) . cand_vec_c,     q = MLP([h_k, ctx_k, tool, parameter name, args so far])

Everything an environment is made of (tool names, parameter names, instruction words) enters as
hashed word embeddings shared across environments, so skill transfers between environments only
through what they share, and environment-specific words are learned only from their own tasks.
About 0.7M parameters with the defaults; one forward/backward over a 64 x 8 step takes well
under a second on 2 CPU cores.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import torch
from torch import nn

from trainer.neural.text import MAX_INSTRUCTION, SHAPES, VOCAB

MAX_SOURCE = 9  # output recency buckets


@dataclass(frozen=True)
class PolicyConfig:
    dim: int = 64
    layers: int = 2
    heads: int = 4
    vocab: int = VOCAB

    def to_dict(self) -> dict:
        return asdict(self)


def _mlp(n_in: int, d: int) -> nn.Sequential:
    return nn.Sequential(nn.Linear(n_in, 2 * d), nn.GELU(), nn.Linear(2 * d, d))


class PointerPolicy(nn.Module):
    def __init__(self, config: PolicyConfig = PolicyConfig()):
        super().__init__()
        d = config.dim
        self.config = config
        self.word = nn.Embedding(config.vocab, d, padding_idx=0)
        self.shape = nn.Embedding(len(SHAPES), d)
        self.position = nn.Embedding(MAX_INSTRUCTION + 1, d)
        layer = nn.TransformerEncoderLayer(
            d, config.heads, 2 * d, dropout=0.0, batch_first=True, norm_first=True
        )
        self.encoder = nn.TransformerEncoder(layer, config.layers, enable_nested_tensor=False)
        self.init_h = nn.Linear(d, d)
        self.gru = nn.GRUCell(2 * d, d)
        self.attn_q = nn.Linear(d, d)
        self.tool_z = _mlp(2 * d, d)
        self.tool_w = nn.Linear(d, d, bias=False)
        self.stop = nn.Linear(d, 1)
        self.arg_q = _mlp(5 * d, d)
        self.cand_w = nn.Linear(d, d, bias=False)
        self.source = nn.Embedding(MAX_SOURCE + 1, d)  # 0: instruction, k: k actions ago
        self.key = nn.Embedding(config.vocab, d, padding_idx=0)
        self.used = nn.Embedding(2, d)
        self.cand_norm = nn.LayerNorm(d)

    # ------------------------------------------------------------------ static parts of an episode
    def encode(self, tokens: torch.Tensor, shapes: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """tokens, shapes, mask: (B, L) -> contextual instruction vectors C (B, L, d)."""
        pos = torch.arange(tokens.shape[1], device=tokens.device).clamp_max(MAX_INSTRUCTION)
        x = self.word(tokens) + self.shape(shapes) + self.position(pos)[None]
        return self.encoder(x, src_key_padding_mask=~mask)

    def bag(self, words: torch.Tensor) -> torch.Tensor:
        """(..., W) hashed word ids (0 = padding) -> mean embedding (..., d)."""
        m = (words > 0).unsqueeze(-1).float()
        return (self.word(words) * m).sum(-2) / m.sum(-2).clamp_min(1.0)

    def initial_state(self, C: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        m = mask.unsqueeze(-1).float()
        return torch.tanh(self.init_h((C * m).sum(1) / m.sum(1).clamp_min(1.0)))

    # ------------------------------------------------------------------ one action
    def context(self, h: torch.Tensor, C: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        att = torch.einsum("bd,bld->bl", self.attn_q(h), C) / C.shape[-1] ** 0.5
        att = att.masked_fill(~mask, float("-inf")).softmax(-1)
        return torch.einsum("bl,bld->bd", att, C)

    def tool_logits(self, h, ctx, tool_vecs, tool_mask) -> torch.Tensor:
        """(B, 1 + T): index 0 is stop, 1..T the environment's tools."""
        z = self.tool_z(torch.cat([h, ctx], -1))
        logits = torch.einsum("bd,btd->bt", self.tool_w(z), tool_vecs)
        logits = logits.masked_fill(~tool_mask, float("-inf"))
        return torch.cat([self.stop(z), logits], -1)

    def candidate_base(self, C, cand_instr_pos, cand_word, cand_shape, cand_key) -> torch.Tensor:
        """(B, N, d). Instruction candidates take their contextual vector; output candidates a
        word/shape/key embedding."""
        is_instr = cand_instr_pos >= 0
        idx = cand_instr_pos.clamp_min(0).unsqueeze(-1).expand(-1, -1, C.shape[-1])
        from_instr = torch.gather(C, 1, idx)
        from_output = self.word(cand_word) + self.shape(cand_shape) + self.key(cand_key)
        return torch.where(is_instr.unsqueeze(-1), from_instr, from_output)

    def candidate_vectors(self, base, cand_age) -> torch.Tensor:
        """Candidates at one action: their base vectors with a recency embedding, normalised."""
        return self.cand_norm(base + self.source(cand_age.clamp(0, MAX_SOURCE)))

    def mark_used(self, cand_vecs, cand_used) -> torch.Tensor:
        """Candidates already passed as an argument in this episode carry a learned marker."""
        return cand_vecs + self.used(cand_used.long())

    def arg_logits(self, h, ctx, tool_vec, param_vec, prev_args, cand_vecs, cand_mask) -> torch.Tensor:
        q = self.arg_q(torch.cat([h, ctx, tool_vec, param_vec, prev_args], -1))
        logits = torch.einsum("bd,bnd->bn", self.cand_w(q), cand_vecs)
        return logits.masked_fill(~cand_mask, float("-inf"))

    def advance(self, h, action_vec, output_words) -> torch.Tensor:
        return self.gru(torch.cat([action_vec, self.bag(output_words)], -1), h)


def parameter_count(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())

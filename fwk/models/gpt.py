"""A small decoder-only GPT in plain PyTorch, in nanoGPT style.

It has a token and a learned position embedding, pre-LN blocks of causal self-attention and a
4x GELU MLP, a final LayerNorm, and an lm head whose weight is tied to the token embedding. It
takes GPT-2's init: N(0, 0.02) everywhere, and residual output projections scaled by
1/sqrt(2 * n_layer), so that the residual stream's variance does not grow with depth.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from fwk.models.configs import GPTConfig
from fwk.models.registry import register_model


class CausalSelfAttention(nn.Module):
    def __init__(self, n_embd: int, n_head: int, dropout: float, bias: bool) -> None:
        super().__init__()
        if n_embd % n_head != 0:
            raise ValueError(f"n_embd={n_embd} must be divisible by n_head={n_head}")
        self.n_head = n_head
        self.dropout = dropout
        self.qkv = nn.Linear(n_embd, 3 * n_embd, bias=bias)
        self.proj = nn.Linear(n_embd, n_embd, bias=bias)
        self.proj.is_residual_proj = True  # scaled at init, see GPT._init_weights
        self.resid_drop = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, _ = x.shape
        # (B, T, 3 * nh * hs) -> 3 x (B, nh, T, hs): heads become a batch dimension for the
        # attention kernel. nh * hs is C unless `fwk export` pruned whole heads (n_head drops).
        q, k, v = self.qkv(x).view(B, T, 3, self.n_head, -1).permute(2, 0, 3, 1, 4).unbind(0)
        y = F.scaled_dot_product_attention(
            q, k, v, dropout_p=self.dropout if self.training else 0.0, is_causal=True
        )  # (B, nh, T, hs)
        y = y.transpose(1, 2).reshape(B, T, -1)  # (B, T, nh * hs)
        return self.resid_drop(self.proj(y))


class MLP(nn.Module):
    def __init__(self, n_embd: int, dropout: float, bias: bool) -> None:
        super().__init__()
        self.fc = nn.Linear(n_embd, 4 * n_embd, bias=bias)
        self.proj = nn.Linear(4 * n_embd, n_embd, bias=bias)
        self.proj.is_residual_proj = True  # scaled at init, see GPT._init_weights
        self.drop = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.drop(self.proj(F.gelu(self.fc(x))))


class Block(nn.Module):
    """A pre-LN transformer block: attention, then the MLP, each added to the residual stream.

    It computes ``x + attn(ln(x))``, then ``x + mlp(ln(x))``."""

    def __init__(self, n_embd: int, n_head: int, dropout: float, bias: bool) -> None:
        super().__init__()
        self.ln_1 = nn.LayerNorm(n_embd, bias=bias)
        self.attn = CausalSelfAttention(n_embd, n_head, dropout, bias)
        self.ln_2 = nn.LayerNorm(n_embd, bias=bias)
        self.mlp = MLP(n_embd, dropout, bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln_1(x))
        x = x + self.mlp(self.ln_2(x))
        return x


def plain_head_loss(
    hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor, label_smoothing: float = 0.0
) -> torch.Tensor:
    """Return the head's mean cross-entropy the plain way: all (N, vocab) logits at once, in fp32."""
    return F.cross_entropy((hidden @ weight.t()).float(), targets, label_smoothing=label_smoothing)


class GPT(nn.Module):
    def __init__(
        self,
        vocab_size: int,
        block_size: int,
        n_layer: int,
        n_head: int,
        n_embd: int,
        dropout: float = 0.0,
        bias: bool = False,
    ) -> None:
        super().__init__()
        self.block_size = block_size
        self.vocab_size = vocab_size
        self.n_layer = n_layer
        self.tok_emb = nn.Embedding(vocab_size, n_embd)
        self.pos_emb = nn.Embedding(block_size, n_embd)
        self.drop = nn.Dropout(dropout)
        self.blocks = nn.ModuleList(Block(n_embd, n_head, dropout, bias) for _ in range(n_layer))
        self.ln_f = nn.LayerNorm(n_embd, bias=bias)
        self.lm_head = nn.Linear(n_embd, vocab_size, bias=False)
        # Weight tying: input and output token embeddings share one matrix (fewer
        # parameters, and it trains as well or better at this size).
        self.lm_head.weight = self.tok_emb.weight
        # forward(idx, targets) returns head_loss(hidden, lm_head.weight, targets). A fused,
        # chunked version can be put here (fwk/strategies/kernels.py) without touching the model.
        # head_of names the module whose output it computes, and precision's fp32 islands follow it.
        self.head_loss = plain_head_loss
        self.head_of = "lm_head"
        self.apply(self._init_weights)

    def _init_weights(self, module: nn.Module) -> None:
        if isinstance(module, nn.Linear):
            std = 0.02
            if getattr(module, "is_residual_proj", False):
                # Each block adds two residual branches: scale so the sum stays O(1) (GPT-2).
                std = 0.02 / math.sqrt(2 * self.n_layer)
            nn.init.normal_(module.weight, mean=0.0, std=std)
            if module.bias is not None:
                nn.init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)

    def num_params(self, non_embedding: bool = True) -> int:
        """Return the parameter count, by default without the position table.

        The token table is shared with the lm head, so it counts as a weight."""
        n = sum(p.numel() for p in self.parameters())  # tied weight is counted once
        if non_embedding:
            n -= self.pos_emb.weight.numel()
        return n

    def tp_plan(self, degree: int) -> dict:
        """Return the tensor-parallel styles by module name (``fwk/models/gpt_parallel.py``)."""
        from fwk.models.gpt_parallel import tp_plan

        return tp_plan(self, degree)

    def after_tp(self, degree: int) -> None:
        from fwk.models.gpt_parallel import after_tp

        after_tp(self, degree)

    def pipeline_split(self, n_stages: int) -> list[nn.Module]:
        """Return the model as ``n_stages`` consecutive stages of blocks (``fwk/models/gpt_parallel.py``)."""
        from fwk.models.gpt_parallel import pipeline_split

        return pipeline_split(self, n_stages)

    def forward(self, idx: torch.Tensor, targets: torch.Tensor | None = None, label_smoothing: float = 0.0):
        """Map int64 token ids ``idx`` (B, T) to logits (B, T, vocab_size).

        With ``targets`` of the same shape, return the mean cross-entropy instead, which
        ``head_loss`` computes, so that the logits need not be kept."""
        x = idx
        if self.pos_emb is not None:  # (a later pipeline stage has none: it receives hidden states)
            T = idx.shape[1]
            if T > self.block_size:
                raise ValueError(
                    f"sequence length {T} is longer than block_size={self.block_size}; "
                    f"use seq_len <= {self.block_size} or raise model.block_size"
                )
            pos = torch.arange(T, device=idx.device)  # (T,)
            x = self.drop(self.tok_emb(idx) + self.pos_emb(pos))  # (B, T, C) + (T, C) -> (B, T, C)
        for block in self.blocks.children():  # a ModuleList; a pipeline stage's ModuleDict by index
            x = block(x)
        if self.ln_f is None:  # a pipeline stage before the last
            return x
        x = self.ln_f(x)
        if targets is not None:
            return self.head_loss(x.flatten(0, 1), self.lm_head.weight, targets.flatten(), label_smoothing)
        return self.lm_head(x)  # (B, T, vocab_size)


@register_model(GPTConfig)
def gpt(cfg: GPTConfig) -> nn.Module:
    return GPT(
        vocab_size=cfg.vocab_size,
        block_size=cfg.block_size,
        n_layer=cfg.n_layer,
        n_head=cfg.n_head,
        n_embd=cfg.n_embd,
        dropout=cfg.dropout,
        bias=cfg.bias,
    )

"""The post-norm transformer encoder and decoder of "Attention Is All You Need" (Vaswani et al., arXiv:1706.03762) as
DETR uses them (Carion et al., arXiv:2005.12872): positions added to the queries and keys of every attention, never
to the values; every decoder layer's output read through one shared final norm.

Every attention is vitkit's one `Attention` layer: the encoder's is ``attn(x + pos, mask, value=x)``, the decoder's
self-attention ``attn(tgt + query_pos, value=tgt)`` and its cross-attention ``attn(tgt + query_pos, mask,
key=memory + pos, value=memory)``, so backends, `capture_attention` and costs work as for every model. Parameter
names are DETR's where it has them (`self_attn`, `cross_attn` for its `multihead_attn`, `norm1..3`), the
feed-forward block is vitkit's `Mlp` (`mlp.fc1`, `mlp.fc2`).

Letters: B batch, N memory tokens, Q object queries, D width, L decoder layers.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from vitkit.layers import Attention, Mlp


class EncoderLayer(nn.Module):
    """Post-norm encoder layer on tokens (B, N, D): x = norm1(x + attn(q = k = x + pos, v = x)); x = norm2(x + ffn(x)).

    Args:
        dim: width D.
        num_heads: attention heads.
        dim_feedforward: hidden width of the ReLU feed-forward block.
        drop: dropout after the attention and in the feed-forward block.
        attn_drop: dropout on the attention weights.
        backend: attention backend.
    """

    def __init__(
        self, dim: int, num_heads: int, dim_feedforward: int, drop: float, attn_drop: float, backend: str
    ) -> None:
        super().__init__()
        self.self_attn = Attention(dim, num_heads, True, attn_drop, drop, backend)
        self.norm1 = nn.LayerNorm(dim)
        self.mlp = Mlp(dim, dim_feedforward, drop=drop, act="relu")
        self.norm2 = nn.LayerNorm(dim)

    def forward(self, x: torch.Tensor, pos: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
        """x, pos (B, N, D); mask (B, 1, 1, N) True at real positions, or None."""
        q = x + pos  # queries and keys carry the positions, values do not
        x = self.norm1(x + self.self_attn(q, mask, value=x))
        return self.norm2(x + self.mlp(x))


class DecoderLayer(nn.Module):
    """Post-norm decoder layer on the query slots tgt (B, Q, D):
    tgt = norm1(tgt + self_attn(q = k = tgt + query_pos, v = tgt));
    tgt = norm2(tgt + cross_attn(q = tgt + query_pos, k = memory + pos, v = memory));
    tgt = norm3(tgt + ffn(tgt)). Arguments as for `EncoderLayer`.
    """

    def __init__(
        self, dim: int, num_heads: int, dim_feedforward: int, drop: float, attn_drop: float, backend: str
    ) -> None:
        super().__init__()
        self.self_attn = Attention(dim, num_heads, True, attn_drop, drop, backend)
        self.norm1 = nn.LayerNorm(dim)
        self.cross_attn = Attention(dim, num_heads, True, attn_drop, drop, backend)
        self.norm2 = nn.LayerNorm(dim)
        self.mlp = Mlp(dim, dim_feedforward, drop=drop, act="relu")
        self.norm3 = nn.LayerNorm(dim)

    def forward(
        self,
        tgt: torch.Tensor,
        query_pos: torch.Tensor,
        memory: torch.Tensor,
        memory_key: torch.Tensor,
        mask: torch.Tensor | None,
    ) -> torch.Tensor:
        """tgt (B, Q, D), query_pos (Q, D), memory and memory_key = memory + pos (B, N, D), mask (B, 1, 1, N) / None."""
        q = tgt + query_pos
        tgt = self.norm1(tgt + self.self_attn(q, value=tgt))
        tgt = self.norm2(tgt + self.cross_attn(tgt + query_pos, mask, key=memory_key, value=memory))
        return self.norm3(tgt + self.mlp(tgt))


class Encoder(nn.Module):
    """`EncoderLayer` x depth over the image tokens (B, N, D); no final norm (post-norm layers end normalised)."""

    def __init__(self, depth: int, **layer: Any) -> None:
        super().__init__()
        self.layers = nn.ModuleList([EncoderLayer(**layer) for _ in range(depth)])

    def forward(self, x: torch.Tensor, pos: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
        for layer in self.layers:
            x = layer(x, pos, mask)
        return x  # (B, N, D)


class Decoder(nn.Module):
    """`DecoderLayer` x depth from empty query slots; every layer's output through the one final `norm`."""

    def __init__(self, depth: int, **layer: Any) -> None:
        super().__init__()
        self.layers = nn.ModuleList([DecoderLayer(**layer) for _ in range(depth)])
        self.norm = nn.LayerNorm(layer["dim"])

    def forward(
        self, query_pos: torch.Tensor, memory: torch.Tensor, pos: torch.Tensor, mask: torch.Tensor | None
    ) -> torch.Tensor:
        """query_pos (Q, D), memory and pos (B, N, D), mask (B, 1, 1, N) or None -> (L, B, Q, D).

        The slots start at zero; the normalised outputs are read out, while each layer takes the previous one's
        output as it was (DETR's `return_intermediate`). The query positions broadcast over the batch.
        """
        tgt = memory.new_zeros(memory.shape[0], *query_pos.shape)  # (B, Q, D)
        memory_key = memory + pos  # the keys of every cross-attention
        outputs = []
        for layer in self.layers:
            tgt = layer(tgt, query_pos, memory, memory_key, mask)
            outputs.append(self.norm(tgt))
        return torch.stack(outputs)  # (L, B, Q, D)

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

from vitkit.layers import Attention, CostContext, Mlp, OpCost, Value
from vitkit.layers.cost import Ops, copy_op, elementwise_op, layer_norm_op, new_value, residual


def add_norm(name: str, norm: str, x: Value, branch: list[OpCost], ctx: CostContext) -> list[OpCost]:
    """The operators of a post-norm residual, norm(x + branch(x)): the branch's, the add, the norm `name.norm`."""
    rows = residual(name, x, ctx, branch)
    return [*rows, layer_norm_op(f"{name}.{norm}", rows[-1].output, ctx)]


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

    def cost(self, name: str, x: Value, ctx: CostContext, pos: Value, mask: Value | None = None) -> list[OpCost]:
        """The operators of `forward` on tokens x (B, N, D), in forward order."""
        ops = Ops(x)
        q = ops(elementwise_op(name, "+pos", (x, pos), 1, ctx))  # BND
        x = ops(add_norm(name, "norm1", x, self.self_attn.cost(f"{name}.self_attn", q, ctx, mask, value=x), ctx))
        return ops + add_norm(name, "norm2", x, self.mlp.cost(f"{name}.mlp", x, ctx), ctx)


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

    def cost(
        self,
        name: str,
        tgt: Value,
        ctx: CostContext,
        query_pos: Value,
        memory: Value,
        memory_key: Value,
        mask: Value | None = None,
    ) -> list[OpCost]:
        """The operators of `forward` on the query slots tgt (B, Q, D), in forward order."""
        ops = Ops(tgt)
        q = ops(elementwise_op(name, "+query_pos", (tgt, query_pos), 1, ctx))  # BQD
        attended = self.self_attn.cost(f"{name}.self_attn", q, ctx, value=tgt)
        tgt = ops(add_norm(name, "norm1", tgt, attended, ctx))
        q = ops(elementwise_op(name, "+query_pos", (tgt, query_pos), 1, ctx))  # BQD
        attended = self.cross_attn.cost(f"{name}.cross_attn", q, ctx, mask, key=memory_key, value=memory)
        tgt = ops(add_norm(name, "norm2", tgt, attended, ctx))
        return ops + add_norm(name, "norm3", tgt, self.mlp.cost(f"{name}.mlp", tgt, ctx), ctx)


class Encoder(nn.Module):
    """`EncoderLayer` x depth over the image tokens (B, N, D); no final norm (post-norm layers end normalised)."""

    def __init__(self, depth: int, **layer: Any) -> None:
        super().__init__()
        self.layers = nn.ModuleList([EncoderLayer(**layer) for _ in range(depth)])

    def forward(self, x: torch.Tensor, pos: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
        for layer in self.layers:
            x = layer(x, pos, mask)
        return x  # (B, N, D)

    def cost(self, name: str, x: Value, ctx: CostContext, pos: Value, mask: Value | None = None) -> list[OpCost]:
        ops = Ops(x)
        for i, layer in enumerate(self.layers):
            ops(layer.cost(f"{name}.layers.{i}", ops.out, ctx, pos, mask))
        return ops


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

    def cost(
        self, name: str, query_pos: Value, ctx: CostContext, memory: Value, pos: Value, mask: Value | None = None
    ) -> list[OpCost]:
        B, Q, D = memory.shape[0], *query_pos.shape
        ops = Ops(query_pos)
        tgt = ops(copy_op(name, "zeros", query_pos, (B, Q, D), ctx))  # the empty slots (B, Q, D)
        memory_key = ops(elementwise_op(name, "+pos", (memory, pos), 1, ctx))  # BND
        outputs = []
        for i, layer in enumerate(self.layers):
            tgt = ops(layer.cost(f"{name}.layers.{i}", tgt, ctx, query_pos, memory, memory_key, mask))
            outputs.append(ops(layer_norm_op(f"{name}.norm", tgt, ctx)))  # 8BQD
        return [*ops, OpCost(name, "stack", tuple(outputs), new_value((len(outputs), B, Q, D), ctx), 0, 0)]

"""Bilinear pooling: the channel-by-channel matrix of two feature sets, summed over their positions (B-CNN).

"Bilinear CNN Models for Fine-grained Visual Recognition", Lin, RoyChowdhury and Maji, ICCV 2015
(arXiv:1504.07889). For two feature sets over the same T positions (tokens, or the H * W cells of a map),
fA (B, T, M) and fB (B, T, N):

    S = sum_t outer(fA[t], fB[t]) = fA^T fB   (B, M, N)  the outer products at each position, summed
    x = vec(S)                                (B, M * N)
    y = sign(x) sqrt(|x|)                     signed square root
    y = y / ||y||_2                           L2 normalisation

fA = fB gives the symmetric B-CNN. The positions are summed, as in the paper; the mean would change nothing (but the
effect of `eps`): scaling x by c > 0 scales sign(x) sqrt(|x|) by sqrt(c), which the L2 normalisation divides out.

Self-attention forms the other product of the same kind of features: the (T x T) token-token matrix q k^T, which it
uses to mix the tokens, where bilinear pooling forms the (M x N) channel-channel matrix fA^T fB and so pools the
positions away. `docs/guide.md` states how the two are linked and checks it numerically.

Width: M * N features, 147,456 for ViT-S's 384 channels. `reduce_dim` = r first projects each feature set to r
channels with a learned linear layer (a 1x1 convolution on a map), as covariance-pooling networks after B-CNN do
(MPN-COV, Li et al., ICCV 2017, and iSQRT-COV, Li et al., CVPR 2018, arXiv:1712.01034, reduce ResNet's 2048 channels
to 256): r * r features.

Letters: B batch, T positions, M and N channels of fA and fB (each r after the reduction).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class BilinearPool(nn.Module):
    """Bilinear pooling of fA (B, T, M) and fB (B, T, N) -> (B, M * N), or of one set (fB = fA) -> (B, M * M).

    Args:
        dim: channels M of fA.
        dim_b: channels N of fB; None (the default) pools one feature set with itself, the symmetric B-CNN.
        reduce_dim: project each feature set to this many channels first (a learned linear layer per set), so the
            output has reduce_dim^2 features; None pools the channels as they come.
        eps: the signed square root is computed as x / sqrt(|x| + eps), which keeps it and its gradient finite
            at 0 (sign(x) sqrt(|x|) wherever |x| >> eps).
    """

    def __init__(self, dim: int, dim_b: int | None = None, reduce_dim: int | None = None, eps: float = 1e-8) -> None:
        super().__init__()
        for name, value in (("dim", dim), ("dim_b", dim_b), ("reduce_dim", reduce_dim)):
            if value is not None and value <= 0:
                raise ValueError(f"BilinearPool {name} must be > 0, got {value}")
        self.dims = (dim,) if dim_b is None else (dim, dim_b)  # the channels of each input
        self.eps = eps
        self.reduce_a = nn.Linear(dim, reduce_dim) if reduce_dim else None
        self.reduce_b = nn.Linear(dim_b, reduce_dim) if reduce_dim and dim_b is not None else None
        out_a = reduce_dim or dim
        out_b = out_a if dim_b is None else reduce_dim or dim_b
        self.num_features = out_a * out_b  # the output width

    def check_inputs(self, fa: torch.Tensor, fb: torch.Tensor | None) -> None:
        """ValueError unless fa (and fb, given exactly when the pool was built with `dim_b`) are (B, T, channels)
        with the channels the pool was built for and the same B and T."""
        inputs = (fa,) if fb is None else (fa, fb)
        if len(inputs) != len(self.dims):
            wanted = "one feature set (fB = fA)" if len(self.dims) == 1 else "two feature sets, fA and fB"
            raise ValueError(f"BilinearPool was built for {wanted}, got {len(inputs)}")
        for name, t, dim in zip(("fA", "fB")[: len(inputs)], inputs, self.dims, strict=True):
            if t.ndim != 3 or t.shape[-1] != dim:
                raise ValueError(f"BilinearPool {name} must be (B, T, {dim}), got shape {tuple(t.shape)}")
        if fb is not None and fa.shape[:2] != fb.shape[:2]:
            raise ValueError(
                f"BilinearPool fA {tuple(fa.shape)} and fB {tuple(fb.shape)} must share the batch and positions"
            )

    def forward(self, fa: torch.Tensor, fb: torch.Tensor | None = None) -> torch.Tensor:
        """fA (B, T, M) and fB (B, T, N) (default: fA itself) -> the normalised bilinear features (B, M * N)."""
        self.check_inputs(fa, fb)
        if self.reduce_a is not None:
            fa = self.reduce_a(fa)  # (B, T, r)
        if fb is None:
            fb = fa  # the symmetric pool: one projection, shared
        elif self.reduce_b is not None:
            fb = self.reduce_b(fb)  # (B, T, r)
        pooled = torch.einsum("btm,btn->bmn", fa, fb)  # (B, M, N) = fA^T fB: sum_t of the outer products
        x = pooled.flatten(1)  # vec: (B, M * N)
        y = x * torch.rsqrt(x.abs() + self.eps)  # signed square root: sign(x) sqrt(|x|) = x / sqrt(|x|)
        return F.normalize(y, dim=1)  # y / ||y||_2

    def extra_repr(self) -> str:
        return f"dims={self.dims}, num_features={self.num_features}"

"""BilinearPool against a direct loop over positions, its cost against FlopCounterMode, errors; and the identities
that link it to self-attention (docs/guide.md), checked on the features of a vitkit Attention layer."""

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from vitkit.cost import trace
from vitkit.layers import Attention, BilinearPool


def loop_bilinear(fa: torch.Tensor, fb: torch.Tensor, average: bool = False) -> torch.Tensor:
    """The notes' formula, one image and one position at a time: sum_l fA(l)^T fB(l), vec, sign(x) sqrt(|x|),
    y / ||y||_2 (with `average`, the mean over positions instead of the sum)."""
    out = []
    for a, b in zip(fa, fb, strict=True):  # one image: (T, M), (T, N)
        sigma = torch.zeros(a.shape[1], b.shape[1], dtype=torch.float64)
        for t in range(a.shape[0]):
            sigma += torch.outer(a[t].double(), b[t].double())  # (M, N) at position t
        if average:
            sigma /= a.shape[0]
        x = sigma.flatten()
        y = torch.sign(x) * torch.sqrt(torch.abs(x))
        out.append(y / torch.linalg.vector_norm(y))
    return torch.stack(out).float()


def test_two_feature_sets_equal_the_loop():
    torch.manual_seed(0)
    fa, fb = torch.randn(3, 11, 6), torch.randn(3, 11, 4)
    pool = BilinearPool(6, dim_b=4)
    out = pool(fa, fb)
    assert out.shape == (3, 24) and pool.num_features == 24
    torch.testing.assert_close(out, loop_bilinear(fa, fb))
    torch.testing.assert_close(torch.linalg.vector_norm(out, dim=1), torch.ones(3))


def test_one_feature_set_is_the_symmetric_pool():
    torch.manual_seed(0)
    fa = torch.randn(2, 9, 5)
    out = BilinearPool(5)(fa)
    torch.testing.assert_close(out, loop_bilinear(fa, fa))
    torch.testing.assert_close(out, BilinearPool(5, dim_b=5)(fa, fa))
    matrix = out.view(2, 5, 5)
    torch.testing.assert_close(matrix, matrix.transpose(1, 2))  # fA^T fA is symmetric


def test_reduction_projects_each_set_then_pools():
    torch.manual_seed(0)
    fa, fb = torch.randn(2, 7, 12), torch.randn(2, 7, 10)
    symmetric = BilinearPool(12, reduce_dim=4)
    assert symmetric.num_features == 16 and symmetric.reduce_b is None
    reduced = symmetric.reduce_a(fa)
    torch.testing.assert_close(symmetric(fa), loop_bilinear(reduced, reduced))
    pair = BilinearPool(12, dim_b=10, reduce_dim=3)
    assert pair.num_features == 9
    torch.testing.assert_close(pair(fa, fb), loop_bilinear(pair.reduce_a(fa), pair.reduce_b(fb)))


def test_vit_small_width_with_and_without_the_reduction():
    assert BilinearPool(384).num_features == 147_456
    assert BilinearPool(384, reduce_dim=64).num_features == 4_096


def test_sum_and_mean_over_positions_give_the_same_output():
    torch.manual_seed(0)
    fa, fb = torch.randn(2, 13, 4), torch.randn(2, 13, 3)
    torch.testing.assert_close(loop_bilinear(fa, fb), loop_bilinear(fa, fb, average=True))
    torch.testing.assert_close(BilinearPool(4, dim_b=3)(fa, fb), loop_bilinear(fa, fb, average=True))


def test_gradient_is_finite_where_a_product_is_zero():
    fa = torch.randn(2, 5, 4)
    fa[..., 1] = 0.0  # a dead channel (after a ReLU): a row and a column of exact zeros
    fa.requires_grad_(True)
    BilinearPool(4)(fa).sum().backward()
    assert torch.isfinite(fa.grad).all()


@pytest.mark.parametrize(
    ("pool", "shapes"),
    [
        (BilinearPool(6, dim_b=4), [(2, 9, 6), (2, 9, 4)]),
        (BilinearPool(8, reduce_dim=3), [(2, 9, 8)]),
        (BilinearPool(8, dim_b=5, reduce_dim=3), [(2, 9, 8), (2, 9, 5)]),
    ],
    ids=["pair", "symmetric-reduced", "pair-reduced"],
)
def test_cost_equals_flop_counter(pool, shapes):
    inputs = [torch.randn(shape) for shape in shapes]
    with torch.no_grad(), FlopCounterMode(display=False) as counter:
        out = pool(*inputs)
    ops = trace(pool, *inputs)
    assert sum(op.matmul_flops for op in ops) == counter.get_total_flops()
    assert ops[-1].out_shape == tuple(out.shape)


def test_input_errors_name_what_was_expected():
    pool = BilinearPool(6)
    with pytest.raises(ValueError, match=r"fA must be \(B, T, 6\), got shape \(2, 3, 5\)"):
        pool(torch.randn(2, 3, 5))
    with pytest.raises(ValueError, match=r"built for one feature set \(fB = fA\), got 2"):
        pool(torch.randn(2, 3, 6), torch.randn(2, 3, 6))
    pair = BilinearPool(6, dim_b=4)
    with pytest.raises(ValueError, match="built for two feature sets, fA and fB, got 1"):
        pair(torch.randn(2, 3, 6))
    with pytest.raises(ValueError, match=r"fA \(2, 3, 6\) and fB \(2, 5, 4\) must share the batch and positions"):
        pair(torch.randn(2, 3, 6), torch.randn(2, 5, 4))
    with pytest.raises(ValueError, match="reduce_dim must be > 0, got 0"):
        BilinearPool(6, reduce_dim=0)


# Self-attention and bilinear pooling, on the same features: the queries, keys and values of one head of a vitkit
# Attention layer, each (T, d) for T tokens.


def head_features(T: int = 12, C: int = 16, heads: int = 2) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    torch.manual_seed(0)
    layer = Attention(C, heads)
    qkv = layer.qkv(torch.randn(1, T, C)).reshape(T, 3, heads, C // heads)  # (T, 3, h, d)
    q, k, v = qkv[:, :, 0].double().unbind(1)  # head 0: 3 x (T, d)
    return q.detach(), k.detach(), v.detach()


def test_token_gram_and_channel_gram_share_trace_norm_and_eigenvalues():
    q, k, _ = head_features()
    T, d = q.shape
    tokens = q @ k.T  # (T, T): what attention forms, one logit per pair of tokens
    channels = q.T @ k  # (d, d): what bilinear pooling forms, sum over t of the outer products q_t k_t^T
    torch.testing.assert_close(channels, sum(torch.outer(q[t], k[t]) for t in range(T)))
    for p in (1, 2, 3):  # trace((A B)^p) = trace((B A)^p) with A = q, B = k^T
        torch.testing.assert_close(
            torch.linalg.matrix_power(tokens, p).trace(), torch.linalg.matrix_power(channels.T, p).trace()
        )
    # one feature set (q = k = X): ||X X^T||_F = ||X^T X||_F, and the d eigenvalues of X^T X are the nonzero ones of
    # X X^T, whose other T - d are zero (rank d)
    gram_tokens, gram_channels = q @ q.T, q.T @ q
    torch.testing.assert_close(torch.linalg.matrix_norm(gram_tokens), torch.linalg.matrix_norm(gram_channels))
    eig_tokens, eig_channels = torch.linalg.eigvalsh(gram_tokens), torch.linalg.eigvalsh(gram_channels)
    torch.testing.assert_close(eig_tokens[T - d :], eig_channels)
    torch.testing.assert_close(eig_tokens[: T - d], torch.zeros(T - d, dtype=q.dtype), atol=1e-10, rtol=0)
    assert tokens.shape == (T, T) and channels.shape == (d, d)


def test_attention_without_softmax_is_the_queries_times_the_bilinear_pool_of_keys_and_values():
    q, k, v = head_features()
    pooled = sum(torch.outer(k[t], v[t]) for t in range(len(k)))  # (d, d): bilinear pool of fA = k, fB = v
    torch.testing.assert_close((q @ k.T) @ v, q @ pooled)  # mix tokens by q k^T == query the pooled matrix
    # so without the softmax each output is linear in its query, a fixed (d, d) map; with it, it is not
    torch.testing.assert_close(((2 * q) @ k.T) @ v, 2 * (q @ k.T) @ v)
    softmax = lambda queries: torch.softmax(queries @ k.T, dim=-1) @ v  # noqa: E731
    assert not torch.allclose(softmax(2 * q), 2 * softmax(q))

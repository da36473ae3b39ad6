"""What ViT's LayerNorm normalises, on the activations entering a real vitkit block: each token over its C channels
(statistics per (b, n)), not each channel over the tokens (InstanceNorm, per (b, c)) nor over batch and tokens
(BatchNorm, per c); swapping it for either changes the block's output."""

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import vitkit


def per_token(x: torch.Tensor, eps: float) -> torch.Tensor:
    """LayerNorm's statistics: mean and variance of each token's C channels, per (b, n)."""
    return (x - x.mean(dim=2, keepdim=True)) / torch.sqrt(x.var(dim=2, unbiased=False, keepdim=True) + eps)


def per_channel_over_tokens(x: torch.Tensor, eps: float) -> torch.Tensor:
    """InstanceNorm's statistics with the tokens as the positions: per (b, c), over the N tokens."""
    return (x - x.mean(dim=1, keepdim=True)) / torch.sqrt(x.var(dim=1, unbiased=False, keepdim=True) + eps)


def per_channel_over_batch_and_tokens(x: torch.Tensor, eps: float) -> torch.Tensor:
    """BatchNorm's (training) statistics: per c, over the B images and N tokens."""
    mean = x.mean(dim=(0, 1), keepdim=True)
    return (x - mean) / torch.sqrt(x.var(dim=(0, 1), unbiased=False, keepdim=True) + eps)


class Swapped(nn.Module):
    """A norm with another normalisation and the original LayerNorm's affine parameters."""

    def __init__(self, norm: nn.LayerNorm, normalise) -> None:
        super().__init__()
        self.norm, self.normalise = norm, normalise

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.normalise(x, self.norm.eps) * self.norm.weight + self.norm.bias


@pytest.fixture(scope="module")
def block_input():
    """A small ViT (49 patch tokens + the class token, 192 channels), its second block, and the tokens entering the
    block's first LayerNorm for 4 images; the norm's affine parameters randomised so that they count."""
    torch.manual_seed(0)
    model = vitkit.create_model("vit_tiny_patch16_224", img_size=112, depth=2).eval()
    block = model.blocks[1]
    with torch.no_grad():
        block.norm1.weight.uniform_(0.5, 1.5)
        block.norm1.bias.normal_(0, 0.1)
    seen = {}
    hook = block.norm1.register_forward_hook(lambda module, args, out: seen.update(x=args[0], out=out))
    with torch.no_grad():
        model(torch.randn(4, 3, 112, 112))
    hook.remove()
    return block, seen["x"], seen["out"]


def test_vit_layernorm_takes_statistics_per_token_over_channels(block_input):
    block, x, out = block_input
    norm = block.norm1
    assert isinstance(norm, nn.LayerNorm) and norm.normalized_shape == (x.shape[-1],)
    affine = lambda z: z * norm.weight + norm.bias  # noqa: E731
    torch.testing.assert_close(out, affine(per_token(x, norm.eps)), atol=1e-5, rtol=1e-5)
    for other in (per_channel_over_tokens, per_channel_over_batch_and_tokens):
        difference = (out - affine(other(x, norm.eps))).abs().max()
        assert difference > 0.5, other.__name__  # not a rounding difference

    z = (out - norm.bias) / norm.weight  # before the affine: each token has mean 0 and variance 1 over channels
    torch.testing.assert_close(z.mean(dim=2), torch.zeros(z.shape[:2]), atol=1e-5, rtol=0)
    torch.testing.assert_close(z.var(dim=2, unbiased=False), torch.ones(z.shape[:2]), atol=1e-3, rtol=0)
    assert z.mean(dim=1).abs().max() > 0.1  # but a channel, across the tokens of an image, does not
    assert (z.var(dim=1, unbiased=False) - 1).abs().max() > 0.1


def test_torch_norm_layers_agree_with_the_three_readings(block_input):
    """The same statistics from torch's own layers: LayerNorm(C), InstanceNorm1d over (B, C, N), BatchNorm1d."""
    _, x, _ = block_input
    C, eps = x.shape[-1], 1e-6
    torch.testing.assert_close(F.layer_norm(x, (C,), eps=eps), per_token(x, eps), atol=1e-5, rtol=1e-5)
    instance = F.instance_norm(x.transpose(1, 2), eps=eps).transpose(1, 2)  # (B, C, N): positions are the tokens
    torch.testing.assert_close(instance, per_channel_over_tokens(x, eps), atol=1e-5, rtol=1e-5)
    batch = F.batch_norm(x.reshape(-1, C), None, None, training=True, eps=eps).view_as(x)  # (B * N, C)
    torch.testing.assert_close(batch, per_channel_over_batch_and_tokens(x, eps), atol=1e-5, rtol=1e-5)
    # "LayerNorm is InstanceNorm" holds only with the tokens read as channels and the C channels as positions
    torch.testing.assert_close(F.instance_norm(x, eps=eps), per_token(x, eps), atol=1e-5, rtol=1e-5)


def test_swapping_the_norm_changes_the_block_output(block_input):
    block, x, _ = block_input
    norm = block.norm1
    with torch.no_grad():
        reference = block(x)
        outputs = {}
        for normalise in (per_token, per_channel_over_tokens, per_channel_over_batch_and_tokens):
            block.norm1 = Swapped(norm, normalise)
            outputs[normalise.__name__] = block(x)
        block.norm1 = norm
    torch.testing.assert_close(outputs["per_token"], reference, atol=1e-5, rtol=1e-5)
    branches = reference - x  # what the block adds to the residual stream, the part the norm feeds
    for name in ("per_channel_over_tokens", "per_channel_over_batch_and_tokens"):
        change = torch.linalg.vector_norm(outputs[name] - reference) / torch.linalg.vector_norm(branches)
        assert change > 0.05, name  # a float32 rounding difference would be ~1e-6

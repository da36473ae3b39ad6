"""Build a registered model, run one forward pass, read its attention, save and reload it.

Run with `python examples/quickstart.py` (after `make demo` or `pip install -e .`).
"""

import tempfile

import torch

import vitkit


def main() -> None:
    name = "deit_tiny_distilled_patch16_224"
    torch.manual_seed(0)
    model = vitkit.create_model(name).eval()
    params = sum(p.numel() for p in model.parameters())
    print(f"{name}: {params:,} parameters, config: {model.config}")

    images = torch.randn(2, 3, 224, 224)
    with torch.no_grad(), vitkit.capture_attention(model) as maps:
        logits = model(images)
    print(f"logits {tuple(logits.shape)}; attention maps captured from {len(maps)} layers")
    first, last = next(iter(maps)), list(maps)[-1]
    print(f"  {first}: {tuple(maps[first].shape)}  (batch, heads, query tokens, key tokens)")
    cls_to_patches = maps[last][:, :, 0, 2:].mean(1)  # class token -> patch tokens, mean over heads
    print(f"  class-token attention to patches in {last}: max {cls_to_patches.max():.4f}, rows sum to 1")

    with tempfile.TemporaryDirectory() as directory:
        vitkit.save_pretrained(model, directory)
        reloaded = vitkit.from_pretrained(directory)
        with torch.no_grad():
            same = torch.equal(reloaded(images), model(images))
    print(f"saved and reloaded (config.json + model.safetensors): identical logits = {same}")


if __name__ == "__main__":
    main()

"""DETR weights from Hugging Face transformers (`DetrForObjectDetection`, built from small configs with random
weights, never downloaded) give the same predictions in vitkit on a padded batch, and export back."""

import math

import pytest
import torch
import transformers
from safetensors.torch import load_file

import vitkit
from vitkit.detection import pad_images

# Two encoder and two decoder layers of width 64 over a ResNet-18; 10 queries, 5 classes.
HF_SMALL = dict(
    d_model=64,
    encoder_layers=2,
    decoder_layers=2,
    encoder_attention_heads=4,
    decoder_attention_heads=4,
    encoder_ffn_dim=128,
    decoder_ffn_dim=128,
    num_queries=10,
    num_labels=5,
)
# transformers' own ResNet, narrow: bottleneck blocks 1-2-1-1 from a 16-channel stem.
NATIVE = dict(
    layer_type="bottleneck", depths=[1, 2, 1, 1], embedding_size=16, hidden_sizes=[64, 128, 256, 512],
    out_features=["stage4"],
)  # fmt: skip


def randomize(model: torch.nn.Module) -> None:
    """Every parameter and buffer random at a scale that keeps activations O(1): frozen norms around 1, matrices
    ~ 1 / sqrt(fan_in), vectors around their init, so that no weight hides behind a zero or an identity."""
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, t in [*model.named_parameters(), *model.named_buffers()]:
            if name.endswith("running_var"):
                t.copy_(torch.rand(t.shape, generator=g) + 0.5)
            elif t.ndim == 1:
                t.copy_(torch.randn(t.shape, generator=g) * 0.1 + (1.0 if name.endswith("weight") else 0.0))
            else:
                t.copy_(torch.randn(t.shape, generator=g) / math.sqrt(t[0].numel()))


def hf_detr(**config) -> transformers.DetrForObjectDetection:
    torch.manual_seed(0)
    model = transformers.DetrForObjectDetection(
        transformers.DetrConfig(**{**HF_SMALL, **config}, attn_implementation="eager")
    ).eval()
    randomize(model)
    return model


def padded_batch() -> tuple[torch.Tensor, torch.Tensor]:
    """Two images of different sizes, padded: both sides of the mask matter (3 x 5 and 3 x 3 feature maps)."""
    g = torch.Generator().manual_seed(1)
    return pad_images([torch.randn(3, 90, 130, generator=g), torch.randn(3, 70, 80, generator=g)])


def predictions(model: torch.nn.Module, images: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    with torch.no_grad():
        if isinstance(model, transformers.DetrForObjectDetection):
            out = model(pixel_values=images, pixel_mask=mask.long())
            return out.logits, out.pred_boxes
        out = model(images, mask)
        return out["pred_logits"], out["pred_boxes"]


def assert_same(ours: tuple[torch.Tensor, torch.Tensor], theirs: tuple[torch.Tensor, torch.Tensor]) -> None:
    for a, b in zip(ours, theirs, strict=True):
        torch.testing.assert_close(a, b, atol=1e-4, rtol=1e-4)


@pytest.fixture(scope="module")
def timm_resnet18():
    """transformers' DETR on timm's ResNet-18 (the layout of its released checkpoints), saved to a directory."""
    return hf_detr(backbone="resnet18", use_timm_backbone=True)


@pytest.mark.parametrize("backend", ["sdpa", "math"])
def test_hf_directory_gives_the_same_predictions(timm_resnet18, tmp_path, backend):
    timm_resnet18.save_pretrained(tmp_path / "hf")  # transformers 4's names on disk
    ours = vitkit.from_pretrained(tmp_path / "hf", attn_backend=backend)
    c = ours.config
    assert (c.backbone_block, c.backbone_depths, c.backbone_width, c.dilation) == ("basic", (2, 2, 2, 2), 64, False)
    assert (c.hidden_dim, c.num_heads, c.enc_layers, c.dec_layers, c.dim_feedforward) == (64, 4, 2, 2, 128)
    assert (c.num_queries, c.num_classes, c.aux_loss) == (10, 5, False)
    images, mask = padded_batch()
    expected = predictions(timm_resnet18, images, mask)
    assert expected[1].std() > 0.05  # boxes that vary: the comparison sees every layer
    assert_same(predictions(ours, images, mask), expected)


def test_hf_in_memory_names_load_and_qkv_stacks_q_k_v(timm_resnet18):
    state = timm_resnet18.state_dict()  # transformers 5's module names: backbone.model, o_proj, mlp.fc1
    assert "model.encoder.layers.0.self_attn.o_proj.weight" in state
    ours = vitkit.create_model(
        "detr_tiny", backbone_width=64, hidden_dim=64, dim_feedforward=128, num_queries=10, num_classes=5
    ).eval()
    report = vitkit.load_weights(ours, state)
    assert report.format == "hf" and report.loaded == len(ours.state_dict())
    attn = "model.decoder.layers.1.encoder_attn"
    qkv = torch.cat([state[f"{attn}.{p}_proj.weight"] for p in "qkv"])  # rows q | k | v
    assert torch.equal(ours.decoder.layers[1].cross_attn.qkv.weight, qkv)
    images, mask = padded_batch()
    assert_same(predictions(ours, images, mask), predictions(timm_resnet18, images, mask))


def test_export_back_to_transformers(timm_resnet18, tmp_path):
    timm_resnet18.save_pretrained(tmp_path / "hf")
    ours = vitkit.from_pretrained(tmp_path / "hf")
    vitkit.export_weights(ours, tmp_path / "back", format="hf")
    written = load_file(tmp_path / "back" / "model.safetensors")
    assert set(written) == set(load_file(tmp_path / "hf" / "model.safetensors"))  # the same files' names
    back = transformers.DetrForObjectDetection.from_pretrained(tmp_path / "back", attn_implementation="eager").eval()
    images, mask = padded_batch()
    assert_same(predictions(back, images, mask), predictions(timm_resnet18, images, mask))


def test_hf_native_resnet_backbone_round_trip(tmp_path):
    theirs = hf_detr(use_timm_backbone=False, backbone_config=transformers.ResNetConfig(**NATIVE))
    theirs.save_pretrained(tmp_path / "hf")
    ours = vitkit.from_pretrained(tmp_path / "hf")
    c = ours.config
    assert (c.backbone_block, c.backbone_depths, c.backbone_width) == ("bottleneck", (1, 2, 1, 1), 16)
    images, mask = padded_batch()
    expected = predictions(theirs, images, mask)
    assert_same(predictions(ours, images, mask), expected)
    # a 16-wide backbone is no timm ResNet: it goes back as transformers' own
    vitkit.export_weights(ours, tmp_path / "back", format="hf")
    back = transformers.DetrForObjectDetection.from_pretrained(tmp_path / "back", attn_implementation="eager").eval()
    assert back.config.backbone_config.model_type == "resnet"
    assert_same(predictions(back, images, mask), expected)


def test_hf_dc5_dilates_like_timm(tmp_path):
    theirs = hf_detr(backbone="resnet18", use_timm_backbone=True, dilation=True)
    theirs.save_pretrained(tmp_path / "hf")
    ours = vitkit.from_pretrained(tmp_path / "hf", attn_backend="math")
    assert ours.config.dilation
    images, mask = padded_batch()
    assert_same(predictions(ours, images, mask), predictions(theirs, images, mask))


def test_class_count_mismatch_and_reset_head(timm_resnet18, tmp_path):
    timm_resnet18.save_pretrained(tmp_path / "hf")
    sizes = dict(backbone_width=64, hidden_dim=64, dim_feedforward=128, num_queries=10)
    other = vitkit.create_model("detr_tiny", **sizes, num_classes=7)
    with pytest.raises(
        ValueError, match="has a classifier for 5 classes, the model 7: build the model with num_classes=5"
    ):
        vitkit.load_weights(other, tmp_path / "hf")
    report = vitkit.load_weights(other, tmp_path / "hf", reset_head=True)
    assert report.head_reset
    assert torch.equal(other.bbox_embed.layers[0].weight, timm_resnet18.bbox_predictor.layers[0].weight)


def test_unsupported_configs_and_exports(tmp_path):
    learned = hf_detr(backbone="resnet18", use_timm_backbone=True, position_embedding_type="learned")
    learned.save_pretrained(tmp_path / "learned")
    with pytest.raises(ValueError, match="position_embedding_type 'learned' is not supported"):
        vitkit.from_pretrained(tmp_path / "learned")
    narrow_dc5 = vitkit.create_model("detr_tiny", dilation=True)
    with pytest.raises(ValueError, match="dilates \\(DC5\\) timm's ResNets only"):
        vitkit.export_weights(narrow_dc5, tmp_path / "out", format="hf")


@pytest.mark.parametrize("name", ["detr_digits", "deformable_detr_small"])
def test_timm_weights_of_a_detr_are_refused_naming_the_formats_that_hold_it(tmp_path, name):
    """timm has no DETR: its format, vitkit's names under another name, is refused for one, and nothing is
    written; the formats named are those that hold the whole model."""
    model = vitkit.create_model(name)
    said = r"timm has no (Deformable )?DETR models, so no timm weights of one to write; write vitkit or hf"
    with pytest.raises(ValueError, match=said):
        vitkit.export_weights(model, tmp_path / "weights.pth", "timm")
    assert not list(tmp_path.iterdir())

"""Deformable DETR: the paper's variants and parameter counts, the output dict (K sigmoid logits, auxiliary layers,
two-stage proposals), the paper's top-100 reading of detections, config errors, fresh class heads, the cost split,
padded batches. Equality with transformers' Deformable DETR is in tests/weights/test_convert_deformable_detr.py, the
deformable attention in tests/layers/test_deformable.py, the proposals' loss in tests/detection/test_criterion.py."""

import dataclasses
import math

import pytest
import torch

import vitkit
from vitkit.analysis.profile import part_of
from vitkit.detection import Postprocessing, criterion_for, make_denoising, pad_images, postprocess
from vitkit.layers.norm import FrozenBatchNorm2d
from vitkit.layers.pos_embed import nearest_mask
from vitkit.models.deformable_detr import DeformableDETR, DeformableDetrConfig
from vitkit.models.deformable_transformer import box_from_reference, inverse_sigmoid
from vitkit.models.interface import DenoisingSettings, has_no_object_logit
from vitkit.models.registry import model_entry
from vitkit.train.recipe import recipe_for

# The variants' layouts at a size that runs in milliseconds: 8-wide ResNet blocks (one per stage), D = 32 with 2
# heads, 1 encoder and 3 decoder layers, 12 queries, 5 classes, 64x64 images (4 levels: 8x8, 4x4, 2x2, 1x1).
TINY = dict(
    img_size=64, backbone_width=8, backbone_depths=(1, 1, 1, 1), hidden_dim=32, num_heads=2, enc_layers=1,
    dec_layers=3, dim_feedforward=32, num_queries=12, num_classes=5,
)  # fmt: skip
K = TINY["num_classes"]


def tiny(name: str = "deformable_detr_resnet50", **overrides) -> torch.nn.Module:
    """`name` at the TINY size, every parameter moved off its initial value (the zero-initialised box heads' last
    layers, sampling offsets' and attention weights' projections would hide the queries' part), in eval mode."""
    torch.manual_seed(0)
    model = vitkit.create_model(name, **{**TINY, **overrides})
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    return model.eval()


def padded_batch(dtype: torch.dtype = torch.float32) -> tuple[torch.Tensor, torch.Tensor]:
    """A 64x64 image padded beside a 128x96 one: (images (2, 3, 128, 96), pixel_mask (2, 128, 96))."""
    g = torch.Generator().manual_seed(1)
    large, small = torch.randn(3, 128, 96, generator=g, dtype=dtype), torch.randn(3, 64, 64, generator=g, dtype=dtype)
    return pad_images([large, small])


def test_variants_cite_the_paper_and_declare_k_logits():
    names = vitkit.list_models("deformable_detr*")
    assert names == [
        "deformable_detr_digits",
        "deformable_detr_resnet50",
        "deformable_detr_resnet50_box_refine",
        "deformable_detr_resnet50_two_stage",
        "deformable_detr_small",
        "deformable_detr_swin_tiny",
        "deformable_detr_vit_base_dinov2",
        "deformable_detr_vit_small_dinov2",
        "deformable_detr_vit_tiny",
    ]
    small = model_entry("deformable_detr_small").config  # the digits model, two-stage, denoising, BatchNorm
    digits = model_entry("deformable_detr_digits").config
    assert small == dataclasses.replace(digits, two_stage=True, dn_queries=40, backbone_norm="batch")
    for name in names:
        assert "arXiv:2010.04159" in model_entry(name).paper
    assert has_no_object_logit(DeformableDETR) is False  # K sigmoid class logits


@pytest.mark.parametrize(
    ("name", "options", "count"),
    [
        ("deformable_detr_resnet50", {}, 40_069_665),
        ("deformable_detr_resnet50_box_refine", {"with_box_refine": True}, 40_849_660),
        ("deformable_detr_resnet50_two_stage", {"with_box_refine": True, "two_stage": True}, 41_181_529),
    ],
)
def test_resnet50_variants_count_the_parameters_of_transformers_model(name, options, count):
    transformers = pytest.importorskip("transformers")
    with torch.device("meta"):  # shapes only: built in milliseconds
        model = vitkit.create_model(name)
        config = transformers.DeformableDetrConfig(num_labels=91, use_pretrained_backbone=False, **options)
        theirs = transformers.DeformableDetrForObjectDetection(config)
    ours = sum(p.numel() for p in model.parameters())
    expected = sum(p.numel() for p in theirs.parameters())  # tied heads counted once
    if options.get("with_box_refine") and not options.get("two_stage"):
        # the paper's box refinement has a class head per decoder layer; transformers ties them to one
        class_head = 256 * 91 + 91
        expected += (config.decoder_layers - 1) * class_head
    assert ours == expected == count  # the paper's 40M (Table 1), counted
    frozen = [n for n, p in model.named_parameters() if not p.requires_grad]
    assert frozen and all(n.startswith(("backbone.conv1.", "backbone.layer1.")) for n in frozen)


@pytest.mark.parametrize("name", ["deformable_detr_resnet50", "deformable_detr_digits"])
def test_auxiliary_outputs_are_each_earlier_decoder_layers_predictions(name):
    model = tiny(name)
    refine = model.config.box_refine
    images, mask = padded_batch()
    with torch.no_grad():
        out = model(images, mask)
        decoding = model.forward_features(images, mask)
    Q, L = TINY["num_queries"], TINY["dec_layers"]
    assert set(out) == {"pred_logits", "pred_boxes", "aux_outputs"}
    assert out["pred_logits"].shape == (2, Q, K) and out["pred_boxes"].shape == (2, Q, 4)  # K logits: no "no object"
    assert len(out["aux_outputs"]) == L - 1
    layers = [*out["aux_outputs"], {"pred_logits": out["pred_logits"], "pred_boxes": out["pred_boxes"]}]
    with torch.no_grad():
        for i, layer in enumerate(layers):
            assert set(layer) == {"pred_logits", "pred_boxes"}
            state = decoding.states[i]  # (B, Q, D)
            if refine:  # each layer's own heads, its box the one it refined
                logits, boxes = model.class_embed[i](state), decoding.boxes[i]
            else:  # shared heads around the queries' reference points
                logits = model.class_embed(state)
                boxes = box_from_reference(model.bbox_embed(state), inverse_sigmoid(decoding.reference))
            torch.testing.assert_close(layer["pred_logits"], logits)
            torch.testing.assert_close(layer["pred_boxes"], boxes)
            assert layer["pred_boxes"].min() >= 0 and layer["pred_boxes"].max() <= 1
    assert not torch.allclose(layers[0]["pred_logits"], layers[1]["pred_logits"])
    without = tiny(name, aux_loss=False)
    with torch.no_grad():
        last = without(images, mask)
    assert last["aux_outputs"] == []
    torch.testing.assert_close(last["pred_logits"], out["pred_logits"])


def test_two_stage_proposals_are_returned_and_trained():
    model = tiny("deformable_detr_resnet50_two_stage")
    images, mask = padded_batch()
    with torch.no_grad():
        out = model(images, mask)
        decoding = model.forward_features(images, mask)
    N = sum(h * w for h, w in model.level_sizes((128, 96)))  # 16x12 + 8x6 + 4x3 + 2x2 = 256
    enc = out["enc_outputs"]
    assert set(enc) == {"pred_logits", "pred_boxes"} and N == 256
    assert enc["pred_logits"].shape == (2, N, K) and enc["pred_boxes"].shape == (2, N, 4)
    # the decoder's references are the boxes of the Q proposals scored highest on the first class
    best = enc["pred_logits"][..., 0].topk(TINY["num_queries"], dim=1).indices  # (B, Q)
    torch.testing.assert_close(decoding.reference, enc["pred_boxes"].gather(1, best[..., None].expand(-1, -1, 4)))
    # the second image's padding proposes nothing: its anchors are +inf logits, boxes of 1
    padding = torch.cat([~nearest_mask(mask, hw)[1].flatten() for hw in model.level_sizes((128, 96))])  # (N,)
    assert 0 < padding.sum() < N
    assert enc["pred_boxes"][1, padding].eq(1).all() and enc["pred_boxes"][1, ~padding].lt(1).any()

    # The proposal head (the last class and box heads, enc_output) learns from the proposals' loss only: the
    # decoder reads the chosen boxes without gradient and the scores only through their ranking.
    model.train()
    targets = [
        {"labels": torch.tensor([1, 3]), "boxes": torch.tensor([[0.3, 0.3, 0.2, 0.2], [0.7, 0.6, 0.3, 0.4]])},
        {"labels": torch.tensor([4]), "boxes": torch.tensor([[0.5, 0.5, 0.4, 0.3]])},
    ]
    head = model.class_embed[-1].weight
    for aux_loss in (False, True):
        model.zero_grad()
        losses = criterion_for("focal", K, aux_loss, no_object_logit=False)(model(images, mask), targets)
        assert ("loss_ce_enc" in losses) == aux_loss
        losses["total"].backward()
        assert (head.grad is not None and head.grad.abs().sum() > 0) == aux_loss
    assert model.enc_output.weight.grad.abs().sum() > 0 and model.bbox_embed[-1].layers[0].weight.grad.abs().sum() > 0


def test_postprocess_reads_the_papers_top_100_pairs_of_k_sigmoid_logits():
    model = tiny(num_queries=30)  # 30 queries x 5 classes: 150 (query, class) pairs
    with torch.no_grad():
        model.class_embed.bias.copy_(torch.linspace(-1.0, 1.0, K))  # the last class the likeliest: it must be read
    images, mask = padded_batch()
    sizes = [(128, 96), (64, 64)]
    with torch.no_grad():
        out = model.predict(images, mask)
    recipe = recipe_for("detection", "deformable_detr_resnet50")
    reading = Postprocessing(recipe.detection_loss, recipe.detection_top_k, None, has_no_object_logit(model))
    assert reading == Postprocessing("focal", 100, None, no_object_logit=False)
    found = reading(out, sizes, threshold=0.0)
    for i, (H, W) in enumerate(sizes):
        logits, boxes = out["pred_logits"][i], out["pred_boxes"][i]  # (Q, K), (Q, 4)
        pairs = [(1 / (1 + math.exp(-logits[q, k].item())), q, k) for q in range(30) for k in range(K)]
        pairs = sorted(pairs, reverse=True)[:100]  # brute force: every pair, the 100 most probable
        assert found[i]["queries"].tolist() == [q for _, q, _ in pairs]
        assert found[i]["labels"].tolist() == [k for _, _, k in pairs]
        assert K - 1 in found[i]["labels"].tolist()  # no class is taken for "no object"
        torch.testing.assert_close(found[i]["scores"], torch.tensor([s for s, _, _ in pairs]), rtol=1e-5, atol=1e-7)
        cx, cy, w, h = boxes[[q for _, q, _ in pairs]].unbind(-1)
        expected = torch.stack([(cx - w / 2) * W, (cy - h / 2) * H, (cx + w / 2) * W, (cy + h / 2) * H], -1)
        torch.testing.assert_close(found[i]["boxes"], expected)
    with pytest.raises(ValueError, match="has K sigmoid class logits and no 'no object' logit: use 'focal'"):
        postprocess(out, sizes, classification="ce", no_object_logit=False)


def test_config_errors():
    for overrides, message in (
        (dict(two_stage=True), r"two_stage needs box_refine=True"),
        (dict(hidden_dim=48, num_heads=8), r"hidden_dim 48 must be a multiple of 32"),
        (dict(hidden_dim=96, num_heads=7), r"hidden_dim 96 is not divisible by num_heads 7"),
        (
            dict(backbone_stages=(1, 2, 3, 4), num_feature_levels=3),
            r"backbone_stages \(1, 2, 3, 4\) give 4 levels, more than num_feature_levels 3",
        ),
        (dict(backbone_stages=(3, 2)), r"backbone_stages must be increasing stages among 1..4"),
        (dict(backbone_depths=(2, 2, 2)), r"backbone_depths needs 4 stages"),
    ):
        with pytest.raises(ValueError, match=message):
            DeformableDetrConfig(**overrides)
    assert DeformableDetrConfig(num_feature_levels=1).stages == (4,)
    two_stage = tiny("deformable_detr_resnet50_two_stage", num_queries=100)
    with pytest.raises(ValueError, match="keeps the best 100 of the encoder's tokens as proposals, but 64x64 images"):
        two_stage(torch.randn(1, 3, 64, 64))  # 85 tokens


@pytest.mark.parametrize("name", ["deformable_detr_resnet50", "deformable_detr_resnet50_two_stage"])
def test_reset_classifier_gives_every_class_head_the_prior(name):
    model = tiny(name)
    heads = TINY["dec_layers"] + model.config.two_stage if model.config.box_refine else 1
    model.reset_classifier(7, prior=0.2)
    assert model.config.num_classes == 7
    fresh = model.class_heads()
    assert len(fresh) == heads and all(h.out_features == 7 for h in fresh)
    for head in fresh:
        torch.testing.assert_close(head.bias, torch.full((7,), math.log(0.2 / 0.8)))
    images, mask = padded_batch()
    with torch.no_grad():
        out = model(images, mask)
    assert out["pred_logits"].shape[-1] == 7 and all(a["pred_logits"].shape[-1] == 7 for a in out["aux_outputs"])
    if model.config.two_stage:
        assert out["enc_outputs"]["pred_logits"].shape[-1] == 7
    model.reset_classifier(3)  # the paper's prior, 0.01
    assert all(torch.allclose(h.bias, torch.full((3,), -math.log(99.0))) for h in model.class_heads())
    with pytest.raises(ValueError, match=r"prior must be a probability in \(0, 1\), got 1.0"):
        model.reset_classifier(3, prior=1.0)
    with pytest.raises(ValueError, match="num_classes must be > 0, got 0"):
        model.reset_classifier(0)


@pytest.mark.parametrize("name", ["deformable_detr_resnet50", "deformable_detr_resnet50_two_stage"])
def test_profile_splits_into_backbone_embedding_encoder_decoder_and_heads(name):
    report = vitkit.profile(name, img_size=(256, 320))
    macs, flops = {}, {}
    for op in report.ops:
        part = part_of(op.module, report.parts)
        key = part if part in ("backbone", "embedding", "heads") else op.module.split(".")[0]
        macs[key] = macs.get(key, 0) + op.macs
        flops[key] = flops.get(key, 0) + op.flops
    assert set(macs) == {"", "backbone", "embedding", "encoder", "decoder", "heads"}
    assert macs.pop("") == 0 < flops[""]  # the model's own operators: the levels' masks, references and tokens
    assert all(v > 0 for v in macs.values())
    assert sum(macs.values()) == report.macs and sum(flops.values()) == report.flops


@pytest.mark.parametrize("name", ["deformable_detr_digits", "deformable_detr_resnet50_two_stage"])
def test_padding_changes_nothing_of_the_image_it_does_not_pad(name):
    """Batched with a smaller image, the larger one (no padding of its own) predicts as alone; the smaller one
    predicts as in a batch of its own padded the same way (its real part's border sees the padding through the
    backbone's convolutions, so not as alone). Float64, where float32 noise would hide a mistake."""
    model = tiny(name).double()
    images, mask = padded_batch(torch.float64)
    with torch.no_grad():
        batched = model(images, mask)
        large = model(images[:1])
        small = model(images[1:], mask[1:])
    for key in ("pred_logits", "pred_boxes"):
        torch.testing.assert_close(batched[key][:1], large[key], rtol=1e-10, atol=1e-12)
        torch.testing.assert_close(batched[key][1:], small[key], rtol=1e-10, atol=1e-12)
    for a, b, c in zip(batched["aux_outputs"], large["aux_outputs"], small["aux_outputs"], strict=True):
        torch.testing.assert_close(a["pred_boxes"][:1], b["pred_boxes"], rtol=1e-10, atol=1e-12)
        torch.testing.assert_close(a["pred_boxes"][1:], c["pred_boxes"], rtol=1e-10, atol=1e-12)
    # the mask reaches the model: read without it, the smaller image's padding would be image
    with torch.no_grad():
        unmasked = model(images)
    assert not torch.allclose(unmasked["pred_logits"][1], batched["pred_logits"][1])


def test_bfloat16_places_the_encoders_points_at_the_token_centres():
    """In bfloat16 a coordinate beyond 128 pixels steps by a pixel or more: the encoder's reference points (each
    token's centre) and the sampling locations are made in float32. With the first layer's offsets at zero its
    points are the token centres, exactly."""
    model = tiny("deformable_detr_digits").to(torch.bfloat16)
    layer = model.encoder.layers[0].self_attn
    with torch.no_grad():
        layer.sampling_offsets.weight.zero_()
        layer.sampling_offsets.bias.zero_()
    images = torch.randn(1, 3, 64, 8 * 150, dtype=torch.bfloat16)  # level 0: 8 x 150 tokens
    with torch.no_grad(), vitkit.capture_attention(model, ["encoder.layers.0.self_attn"]) as records:
        model(images)
    locations = records["encoder.layers.0.self_attn"].locations  # (1, N, h, L, K, 2)
    assert locations.dtype == torch.float32
    H, W = model.level_sizes((64, 8 * 150))[0]
    x = (torch.arange(W) + 0.5) / W
    first_level = locations[0, : H * W, 0, 0, 0, 0].view(H, W)  # x of each level-0 token's point on level 0
    torch.testing.assert_close(first_level, x.expand(H, W), atol=1e-6, rtol=0)


def denoising_batch(model, seed=0):
    """Denoising queries for two images of 3 and 1 boxes, with the model's settings."""
    g = torch.Generator().manual_seed(seed)
    targets = [
        {"labels": torch.randint(0, K, (n,), generator=g), "boxes": torch.rand(n, 4, generator=g) * 0.3 + 0.2}
        for n in (3, 1)
    ]
    torch.manual_seed(seed)
    return make_denoising(targets, model.denoising_settings(), K)[0]


def test_denoising_queries_do_not_leak_into_the_object_queries():
    """The object queries' predictions are the same with or without denoising queries beside them (float64, weights
    off their init); denoising group 0's do not change when group 1's inputs do."""
    model = tiny("deformable_detr_resnet50_two_stage", dn_queries=12, mixed_queries=True).double()
    images = torch.randn(2, 3, 64, 64, dtype=torch.float64)
    dn = denoising_batch(model)
    assert dn.groups == 2 and dn.labels.shape == (2, 12)
    with torch.no_grad():
        alone = model(images)
        beside = model(images, None, dn)
        other = dataclasses.replace(dn, labels=dn.labels.clone(), boxes=dn.boxes.clone())
        other.labels[:, 6:] = (other.labels[:, 6:] + 1).clamp(max=K - 1)
        other.boxes[:, 6:] = other.boxes[:, 6:].flip(1)
        changed = model(images, None, other)
    for key in ("pred_logits", "pred_boxes"):
        torch.testing.assert_close(beside[key], alone[key], rtol=1e-12, atol=1e-12)
        torch.testing.assert_close(changed["dn_outputs"][key][:, :6], beside["dn_outputs"][key][:, :6])
        assert not torch.allclose(changed["dn_outputs"][key][:, 6:], beside["dn_outputs"][key][:, 6:])
    assert beside["dn_outputs"]["pred_logits"].shape == (2, 12, K) and len(beside["dn_outputs"]["aux_outputs"]) == 2
    assert "dn_outputs" not in alone


def test_denoising_needs_two_stage_and_follows_the_classes():
    with pytest.raises(ValueError, match="dn_queries needs two_stage=True"):
        DeformableDetrConfig(box_refine=True, dn_queries=10)
    with pytest.raises(ValueError, match="mixed_queries needs two_stage=True"):
        DeformableDetrConfig(mixed_queries=True)
    plain = tiny("deformable_detr_resnet50_two_stage")
    assert plain.denoising_settings() is None and not hasattr(plain, "label_embed")
    model = tiny("deformable_detr_resnet50_two_stage", dn_queries=8, dn_label_noise=0.2, dn_box_noise=0.4)
    with pytest.raises(ValueError, match="no denoising queries"):
        plain(torch.randn(2, 3, 64, 64), None, denoising_batch(model))
    assert model.denoising_settings() == DenoisingSettings(8, 0.2, 0.4)
    model.reset_classifier(3)
    assert model.label_embed.weight.shape == (3, 32)


def test_mixed_queries_take_their_contents_from_a_table():
    """With mixed query selection the first decoder layer's contents are `tgt_embed`, whatever the proposals."""
    model = tiny("deformable_detr_resnet50_two_stage", mixed_queries=True)
    seen = []
    model.decoder.layers[0].register_forward_pre_hook(lambda module, args: seen.append(args[0]))
    with torch.no_grad():
        model(torch.randn(2, 3, 64, 64))
    torch.testing.assert_close(seen[0], model.tgt_embed.weight.expand(2, -1, -1))


def test_a_backbone_from_scratch_trains_its_batch_norms(tmp_path):
    """backbone_norm "batch": every norm of the backbone is a BatchNorm2d that learns (its statistics move in
    training, its affine terms are parameters); in eval mode it is the frozen norm of the same values, so the model
    exports to transformers' layout and loads back as a frozen-norm model giving the same boxes."""
    with pytest.raises(ValueError, match=r"backbone_norm must be one of \('frozen', 'batch'\), got 'group'"):
        DeformableDetrConfig(backbone_norm="group")
    model = tiny("deformable_detr_resnet50", backbone_norm="batch", train_stem=True)
    norms = [m for m in model.backbone.modules() if isinstance(m, (torch.nn.BatchNorm2d, FrozenBatchNorm2d))]
    assert norms and all(type(m) is torch.nn.BatchNorm2d for m in norms)
    assert all(m.weight.requires_grad for m in norms)
    before = norms[0].running_mean.clone()
    model.train()(torch.randn(2, 3, 64, 64))
    assert not torch.equal(norms[0].running_mean, before)
    model.eval()
    vitkit.export_weights(model, tmp_path / "hf", format="hf")
    frozen = tiny("deformable_detr_resnet50")
    vitkit.load_weights(frozen, tmp_path / "hf")
    x = torch.randn(2, 3, 64, 64)  # batch 2: the 1x1 fourth level has one value per GroupNorm group and image
    with torch.no_grad():
        torch.testing.assert_close(frozen(x)["pred_boxes"], model(x)["pred_boxes"])

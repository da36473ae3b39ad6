"""The grouped views of a cost report: a detector's rows and the attention share of every attention layer."""

import torch

from vitkit.analysis import profile
from vitkit.analysis.report import grouped, shares
from vitkit.models.registry import create_model


def detr_report():
    with torch.device("meta"):
        model = create_model("detr_tiny").eval()  # the inference costs: no dropout
    return profile(model, (128, 160), batch=2)


def test_detector_rows_are_its_parts_in_forward_order():
    report = detr_report()
    rows = grouped(report, "block")
    assert [r.name for r in rows] == [
        "model", "backbone", "position_embedding", "input_proj", "encoder", "decoder", "heads"
    ]  # fmt: skip (the model's own operators: the images laid out channels-last, the mask, flattening the map)
    assert sum(r.flops for r in rows) == report.flops
    heads = [op for op in report.ops if op.module.split(".")[0] in ("class_embed", "bbox_embed")]
    assert rows[-1].macs == sum(op.macs for op in heads) > 0


def test_attention_share_counts_self_and_cross_attention():
    report = detr_report()
    split = shares(report)
    kinds = {op.module.split(".")[-1] for op in report.ops if ".self_attn" in op.module or ".cross_attn" in op.module}
    attention = sum(op.flops for op in report.ops if op.module.endswith(("self_attn", "cross_attn")))
    cross = sum(op.flops for op in report.ops if op.module.endswith("cross_attn"))
    assert kinds == {"self_attn", "cross_attn"} and cross > 0
    assert split["attention"] == attention / report.flops
    backbone = sum(op.flops for op in report.ops if op.module.split(".")[0] == "backbone")
    assert split["backbone"] == backbone / report.flops
    assert abs(sum(split.values()) - 1) < 1e-12


def test_classifier_split_has_no_backbone_entry():
    with torch.device("meta"):
        model = create_model("vit_digits_patch7_28")
    assert "backbone" not in shares(profile(model))

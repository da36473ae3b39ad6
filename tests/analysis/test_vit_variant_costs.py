"""The ViT options other libraries' ViTs need (vit-pytorch's patch norms and head width, SimpleViT's bias-free
projection, CLIP's pre-norm and quick GELU, SigLIP's attention pooling, registers) cost what the dispatcher counts:
matrix-product FLOPs exactly, activation memory within 1% (FlopCounterMode, PeakMemory), in eval and in training."""

import pytest

import vitkit
from vitkit.analysis import profile

VIT_PYTORCH = dict(patch_norm=True, head_dim=20, qkv_bias=False, layer_norm_eps=1e-5, num_heads=3)
CASES = {
    "vit-pytorch": dict(VIT_PYTORCH, fc_norm=False),
    "simple-vit": dict(
        VIT_PYTORCH, class_token=False, global_pool="avg", fc_norm=False, proj_bias=False, pos_embed="sincos_big_vision"
    ),
    "clip": dict(pre_norm=True, patch_bias=False, act="quick_gelu"),
    "siglip": dict(class_token=False, global_pool="map", act="gelu_tanh"),
    "registers": dict(reg_tokens=4, no_embed_class=True, init_values=1e-5),
}


@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("training", [False, True], ids=["eval", "train"])
def test_vit_options_cost_what_the_dispatcher_counts(case, training):
    model = vitkit.create_model("vit_tiny_patch16_224", img_size=64, depth=2, num_classes=5, **CASES[case])
    model.train(training)
    report = profile(model, 64, batch=2, measure=True)
    assert report.matmul_flops == report.measured_matmul_flops
    assert report.activation_bytes == pytest.approx(report.measured_activation_bytes, rel=0.01)

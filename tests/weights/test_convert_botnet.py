"""BoTNet weights from timm: a saved botnet26t_256 state dict loads with equal logits and exports back."""

import pytest
import timm
import torch
from safetensors.torch import save_file

import vitkit


@pytest.mark.parametrize("suffix", [".pth", ".safetensors"])
def test_timm_botnet_file_loads_with_equal_logits(tmp_path, suffix):
    torch.manual_seed(0)
    theirs = timm.create_model("botnet26t_256", pretrained=False, num_classes=7).eval()
    for module in theirs.modules():  # timm zero-inits the last BatchNorm of each block: give it values
        if isinstance(module, torch.nn.BatchNorm2d):
            torch.nn.init.uniform_(module.weight, 0.5, 1.5)
            torch.nn.init.uniform_(module.running_var, 0.5, 1.5)
    path = tmp_path / f"botnet{suffix}"
    state = {f"module.{k}": v for k, v in theirs.state_dict().items()}  # as DistributedDataParallel saves it
    if suffix == ".pth":
        torch.save({"state_dict": state, "epoch": 3}, path)
    else:
        save_file(state, path)
    ours = vitkit.create_model("botnet26t_256", num_classes=7).eval()
    report = vitkit.load_weights(ours, path)
    assert report.format == "vitkit" and report.loaded == len(theirs.state_dict())
    x = torch.randn(1, 3, 256, 256)
    with torch.no_grad():
        torch.testing.assert_close(ours(x), theirs(x), atol=1e-5, rtol=1e-5)

    back = timm.create_model("botnet26t_256", pretrained=False, num_classes=7).eval()
    back.load_state_dict(torch.load(vitkit.export_weights(ours, tmp_path / "out.pth", format="timm")))
    with torch.no_grad():
        torch.testing.assert_close(back(x), theirs(x), atol=1e-5, rtol=1e-5)


def test_vit_checkpoint_into_botnet_names_what_it_is(tmp_path):
    path = tmp_path / "vit.pth"
    torch.save(vitkit.create_model("vit_tiny_patch16_224", depth=1).state_dict(), path)
    with pytest.raises(ValueError, match="vit"):
        vitkit.load_weights(vitkit.create_model("botnet26t_256"), path)

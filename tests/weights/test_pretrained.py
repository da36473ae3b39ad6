"""Published weights by name, offline: a Hugging Face cache built by the test (huggingface_hub's layout,
HF_HUB_OFFLINE=1) holding a timm repository written by timm and a transformers Deformable DETR written by
transformers, with weights moved off their initial values; `vitkit.create_model(name, pretrained=...)` and
`vitkit.from_pretrained("hf-hub:...")` give the outputs of the reference and of the same files read from a path, with
their label names and the commit they came from; torch.hub's cache for torchvision's files; and each failure's own
message."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import timm
import torch
import torchvision
import transformers
from PIL import Image, ImageFilter

import vitkit
from vitkit.data import preprocess
from vitkit.models.registry import list_pretrained, published_weights
from vitkit.weights import DamagedDownload, HubRepositoryError, NotCached, load_report, model_info
from vitkit.weights.hub import hub_snapshot

TIMM_REPO = "timm/vit_tiny_patch16_224.augreg_in21k_ft_in1k"  # vit_tiny_patch16_224's default weights
COMMIT = "0123456789abcdef0123456789abcdef01234567"
OTHER_COMMIT = "89abcdef0123456789abcdef0123456789abcdef"
DETR_REPO = "vitkit-tests/deformable-detr-small"


def test_create_model_pretrained_loads_the_default_weights_from_the_cache(hub_cache, timm_vit):
    theirs, folder = timm_vit
    hub_cache.put(TIMM_REPO, folder)
    model = vitkit.create_model("vit_tiny_patch16_224", pretrained=True).eval()
    x = torch.randn(2, 3, 224, 224)
    with torch.no_grad():
        torch.testing.assert_close(model(x), theirs(x), atol=1e-4, rtol=1e-4)
        assert torch.equal(model(x), vitkit.from_pretrained(folder)(x))  # the same files read from a path
    info = model_info(model)
    assert info.weights == f"hf-hub:{TIMM_REPO}@{COMMIT}"
    # the names in timm's order of the head's outputs (timm's ImageNet descriptions, where torchvision's names
    # are the first of each, or that with a word added to tell two apart: "crane bird")
    described = [words.split(", ") for words in timm.data.ImageNetInfo().label_descriptions()]
    assert all(name in words or name.startswith(words[0]) for name, words in zip(info.classes, described, strict=True))
    assert info.classes[281] == "tabby" and info.mean == (0.5, 0.5, 0.5) and info.std == (0.5, 0.5, 0.5)
    assert load_report(model).source == info.weights and load_report(model).loaded == len(theirs.state_dict())
    # the tag by name, as timm writes it, and by argument
    for same in (
        vitkit.create_model("vit_tiny_patch16_224.augreg_in21k_ft_in1k", pretrained=True),
        vitkit.create_model("vit_tiny_patch16_224", pretrained="augreg_in21k_ft_in1k"),
    ):
        pairs = zip(same.state_dict().values(), model.state_dict().values(), strict=True)
        assert all(torch.equal(a, b) for a, b in pairs)


def test_images_are_framed_as_timm_evaluates_the_weights(hub_cache, timm_vit, tmp_path):
    """timm's pretrained_cfg (crop_pct 0.9, bicubic for these weights): `predict`'s input is timm's own eval
    transform's on an image of another shape, and a saved copy keeps it."""
    theirs, folder = timm_vit
    hub_cache.put(TIMM_REPO, folder)
    model = vitkit.create_model("vit_tiny_patch16_224", pretrained=True).eval()
    info = model_info(model)
    assert (info.crop_pct, info.interpolation, info.crop_mode) == (0.9, "bicubic", None)  # "center": the default
    transform = timm.data.create_transform(**timm.data.resolve_data_config({}, model=theirs))
    rng = np.random.default_rng(0)
    image = Image.fromarray(rng.integers(0, 256, (300, 451, 3), dtype=np.uint8)).filter(ImageFilter.GaussianBlur(2))
    expected = transform(image)  # (3, 224, 224): the shorter side to 248, bicubic, the centre 224
    got = preprocess(image, (224, 224), 3, info.mean, info.std, info.framing())
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=0)
    vitkit.save_pretrained(model, tmp_path / "copy")
    assert vitkit.weights.read_model_info(tmp_path / "copy").framing() == info.framing()
    with torch.no_grad():  # the same top classes as timm's on its own input
        assert torch.equal(model(got[None]).topk(5).indices, theirs(expected[None]).topk(5).indices)


def test_a_features_model_from_the_published_weights(hub_cache, timm_vit):
    """`features_only=True` with `pretrained=True`: timm's features model of the loaded weights (its last three
    blocks' maps), carrying the weights' normalisation and framing but no class names."""
    theirs, folder = timm_vit
    hub_cache.put(TIMM_REPO, folder)
    model = vitkit.create_model("vit_tiny_patch16_224", pretrained=True, features_only=True).eval()
    x = torch.randn(2, 3, 224, 224)
    with torch.no_grad():
        expected = theirs.forward_intermediates(x, indices=3, intermediates_only=True)
        for a, b in zip(model(x), expected, strict=True):
            torch.testing.assert_close(a, b, atol=1e-4, rtol=1e-4)
    info = model_info(model)
    assert info.mean == (0.5, 0.5, 0.5) and info.crop_pct == 0.9 and info.classes is None
    assert info.weights == f"hf-hub:{TIMM_REPO}@{COMMIT}"


@pytest.mark.parametrize("channels", [1, 4])
def test_other_input_channels_fit_the_rgb_weights_as_timm_does(hub_cache, timm_vit, channels):
    """A grey (or 4-channel) model from RGB weights: the patch embedding summed over R, G and B (or repeated and
    scaled), timm's `adapt_input_conv`; everything else as loaded, and the load report says so."""
    from timm.models._manipulate import adapt_input_conv

    theirs, folder = timm_vit
    hub_cache.put(TIMM_REPO, folder)
    model = vitkit.create_model("vit_tiny_patch16_224", pretrained=True, in_chans=channels).eval()
    expected = adapt_input_conv(channels, theirs.patch_embed.proj.weight.detach())
    assert torch.equal(model.patch_embed.proj.weight, expected)
    assert torch.equal(model.blocks[0].attn.qkv.weight, theirs.blocks[0].attn.qkv.weight)
    assert load_report(model).resampled[0].startswith(f"patch_embed.proj.weight: 3 -> {channels} input channels")
    if channels == 1:  # a grey image gives what the RGB model gives on it repeated in R, G and B
        x = torch.randn(2, 1, 224, 224)
        with torch.no_grad():
            torch.testing.assert_close(model(x), theirs(x.repeat(1, 3, 1, 1)), atol=1e-4, rtol=1e-4)
    info = model_info(model)  # the published normalisation (its mean read for one channel), names and all
    assert info.mean == (0.5, 0.5, 0.5) and info.classes is not None


def test_another_number_of_classes_keeps_a_fresh_head(hub_cache, timm_vit):
    theirs, folder = timm_vit
    hub_cache.put(TIMM_REPO, folder)
    torch.manual_seed(1)
    model = vitkit.create_model("vit_tiny_patch16_224", pretrained=True, num_classes=5, img_size=112)
    report = load_report(model)
    assert report.head_reset and model.head.weight.shape == (5, 192)
    assert torch.equal(model.blocks[3].mlp.fc1.weight, theirs.blocks[3].mlp.fc1.weight)
    assert model.pos_embed.shape == (1, 50, 192) and report.resampled  # the position table fitted to 112 x 112
    info = model_info(model)
    assert info.classes is None and info.weights == f"hf-hub:{TIMM_REPO}@{COMMIT}"  # 1000 names fit no 5-class head


def test_a_tag_names_the_architecture_its_weights_need():
    model = vitkit.create_model("vit_tiny_patch16_224.augreg_in21k")  # no download: pretrained=False
    assert model.head.weight.shape == (21843, 192)
    assert vitkit.create_model("vit_base_patch16_224.orig_in21k").config.num_classes == 0


def test_from_pretrained_of_a_hub_repository_and_its_revisions(hub_cache, hf_deformable, nudge, tmp_path):
    theirs, folder = hf_deformable
    hub_cache.put(DETR_REPO, folder)
    model = vitkit.from_pretrained(f"hf-hub:{DETR_REPO}")
    path_model = vitkit.from_pretrained(folder)
    x = torch.randn(1, 3, 128, 160)
    with torch.no_grad():
        ours, ref = model(x), path_model(x)
        out = theirs(pixel_values=x)
    assert torch.equal(ours["pred_logits"], ref["pred_logits"]) and torch.equal(ours["pred_boxes"], ref["pred_boxes"])
    torch.testing.assert_close(ours["pred_logits"], out.logits, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(ours["pred_boxes"], out.pred_boxes, atol=1e-4, rtol=1e-4)
    info = model_info(model)
    assert info.weights == f"hf-hub:{DETR_REPO}@{COMMIT}" and info.classes[7] == "thing 7"
    assert info.mean == (0.45, 0.46, 0.47) and info.std == (0.2, 0.21, 0.22)
    # another commit, on a branch: pinned by name and by commit
    other = tmp_path / "other"
    other.mkdir()
    nudged = nudge(transformers.DeformableDetrForObjectDetection(theirs.config), seed=1)
    nudged.save_pretrained(other)
    hub_cache.put(DETR_REPO, other, commit=OTHER_COMMIT, ref="v2")
    for pinned in (
        vitkit.from_pretrained(f"hf-hub:{DETR_REPO}@v2"),
        vitkit.from_pretrained(f"hf-hub:{DETR_REPO}@{OTHER_COMMIT}"),
        vitkit.from_pretrained(f"hf-hub:{DETR_REPO}", revision="v2"),
    ):
        assert model_info(pinned).weights == f"hf-hub:{DETR_REPO}@{OTHER_COMMIT}"
        assert not torch.equal(pinned.class_embed[0].weight, model.class_embed[0].weight)
    assert model_info(vitkit.from_pretrained(f"hf-hub:{DETR_REPO}")).weights.endswith(COMMIT)  # main as it was
    with pytest.raises(ValueError, match="revision='v2' is for a Hub repository"):
        vitkit.from_pretrained(folder, revision="v2")
    with pytest.raises(ValueError, match=f"two revisions given: hf-hub:{DETR_REPO}@main and revision='v2'"):
        vitkit.from_pretrained(f"hf-hub:{DETR_REPO}@main", revision="v2")
    # a cache cleared while the process runs (`hf cache delete`): looked up again, not a folder that is gone
    import shutil

    shutil.rmtree(hub_cache.hub / f"models--{DETR_REPO.replace('/', '--')}")
    with pytest.raises(NotCached, match=f"hf-hub:{DETR_REPO}: config.json not found"):
        vitkit.from_pretrained(f"hf-hub:{DETR_REPO}")


def test_create_model_of_a_detector_from_its_transformers_weights(hub_cache, hf_deformable, point_table):
    """The registered model loads a transformers repository, its labels and normalisation with it (a small one
    stands in for SenseTime's: the table's entry is pointed at it)."""
    theirs, folder = hf_deformable
    hub_cache.put(DETR_REPO, folder)
    point_table("deformable_detr_resnet50", f"hf-hub:{DETR_REPO}", vitkit.from_pretrained(folder).config)
    model = vitkit.create_model("deformable_detr_resnet50", pretrained=True).eval()
    x = torch.randn(1, 3, 96, 96)
    with torch.no_grad():
        torch.testing.assert_close(model(x)["pred_logits"], theirs(pixel_values=x).logits, atol=1e-4, rtol=1e-4)
    assert model_info(model).classes[90] == "thing 90" and model_info(model).mean == (0.45, 0.46, 0.47)
    fine = vitkit.create_model("deformable_detr_resnet50", pretrained="coco", num_classes=3)
    assert fine.class_embed[0].weight.shape[0] == 3 and load_report(fine).head_reset


def test_a_torchvision_backbone_from_the_torch_hub_cache(hub_cache, nudge, point_table):
    torch.manual_seed(0)
    resnet = nudge(torchvision.models.resnet50())
    path = hub_cache.torch_dir / "resnet.pth"
    path.parent.mkdir(parents=True)
    torch.save(resnet.state_dict(), path)
    data = path.read_bytes()
    import hashlib

    digest = hashlib.sha256(data).hexdigest()[:8]
    _, weights = published_weights("detr_resnet50", "tv_in1k")
    name = weights.source.rsplit("/", 1)[1]
    # the name's hash prefix is the published file's: a file of other content under it is refused
    hub_cache.put_torch(name, data)
    with pytest.raises(DamagedDownload, match=r"is not the file published at .*: delete .* and download it again"):
        vitkit.create_model("detr_resnet50", pretrained="tv_in1k")
    # the same file under its own hash's name loads (the table's URL pointed at it)

    own = f"resnet50-{digest}.pth"
    hub_cache.put_torch(own, data)
    url = weights.source.replace(name, own)
    point_table("detr_resnet50", url, tag="tv_in1k")
    model = vitkit.create_model("detr_resnet50", pretrained="tv_in1k")
    assert torch.equal(model.backbone.layer3[2].conv2.weight, resnet.layer3[2].conv2.weight)
    report = load_report(model)
    assert report.source == url and report.uncovered and model_info(model).weights == url


def test_offline_and_not_cached_names_the_repository_the_cache_and_the_command(hub_cache):
    with pytest.raises(NotCached) as err:
        vitkit.create_model("vit_small_patch16_224", pretrained=True)
    message = str(err.value)
    repo = "timm/vit_small_patch16_224.augreg_in21k_ft_in1k"
    assert f"hf-hub:{repo}: config.json not found in the Hugging Face cache ({hub_cache.hub}/models--timm--" in message
    assert "HF_HUB_OFFLINE=1" in message and f"`hf download {repo}`" in message
    assert f"`hf download {repo} --local-dir DIR`" in message and "vitkit.from_pretrained('DIR')" in message
    with pytest.raises(NotCached, match=r"torch.hub's cache .* HF_HUB_OFFLINE=1.*download_url_to_file"):
        vitkit.create_model("detr_resnet50", pretrained="tv2_in1k")


def test_a_partial_download_and_a_damaged_file_get_their_own_messages(hub_cache, timm_vit):
    _, folder = timm_vit
    snapshot = hub_cache.put(TIMM_REPO, folder)
    blob = (snapshot / "model.safetensors").resolve()
    blob.write_bytes(blob.read_bytes()[:-100])  # cut short: not the content its sha256 names
    with pytest.raises(DamagedDownload, match=r"model.safetensors in the cache .* is not the file the Hub published"):
        vitkit.create_model("vit_tiny_patch16_224", pretrained=True)
    # a download that stopped part way: huggingface_hub's .incomplete blob, no file in the snapshot
    (snapshot / "model.safetensors").unlink()
    blob.rename(blob.with_name(blob.name + ".incomplete"))
    with pytest.raises(NotCached, match="A download of it stopped part way"):
        hub_snapshot(f"hf-hub:{TIMM_REPO}", revision=COMMIT)


def test_a_repository_vitkit_cannot_read(hub_cache, tmp_path):
    folder = tmp_path / "bert"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"model_type": "bert", "hidden_size": 8}))
    torch.save({"w": torch.zeros(1)}, folder / "pytorch_model.bin")
    hub_cache.put("someone/bert", folder)
    with pytest.raises(ValueError, match=r"model_type 'bert' is not supported; supported: \["):
        vitkit.from_pretrained("hf-hub:someone/bert")
    (folder / "config.json").write_text(json.dumps({"architecture": "convnext_tiny", "num_classes": 1000}))
    hub_cache.put("timm/convnext_tiny", folder, commit=OTHER_COMMIT)
    with pytest.raises(ValueError, match="a timm model directory of 'convnext_tiny', which vitkit does not have"):
        vitkit.from_pretrained(f"hf-hub:timm/convnext_tiny@{OTHER_COMMIT}")
    empty = tmp_path / "empty"
    empty.mkdir()
    (empty / "config.json").write_text("{}")
    hub_cache.put("someone/no-weights", empty, absent=("model.safetensors", "pytorch_model.bin"))
    with pytest.raises(HubRepositoryError, match="has none of .*model.safetensors"):
        vitkit.from_pretrained("hf-hub:someone/no-weights")
    # known to have no model.safetensors, its pytorch_model.bin not cached: that file is named, not the config
    hub_cache.put("someone/bin-only", empty, absent=("model.safetensors",))
    with pytest.raises(NotCached, match=r"hf-hub:someone/bin-only: pytorch_model.bin not found in the Hugging Face"):
        vitkit.from_pretrained("hf-hub:someone/bin-only")


def test_a_gated_repository_without_a_token(hub_cache, monkeypatch):
    """huggingface_hub's answer for a gated repository (no network here: its error is raised where its download
    would be) becomes the steps that give access."""
    from types import SimpleNamespace

    import huggingface_hub
    from huggingface_hub.errors import GatedRepoError, RepositoryNotFoundError

    response = SimpleNamespace(headers={}, request=None)  # what the errors read of the HTTP response

    def gated(*args, **kwargs):
        raise GatedRepoError("401 Client Error: access to this model is restricted", response=response)

    monkeypatch.setattr(huggingface_hub, "hf_hub_download", gated)
    with pytest.raises(HubRepositoryError, match=r"is gated: accept its conditions on https://huggingface.co/org/x"):
        hub_snapshot("hf-hub:org/x")

    def missing(*args, **kwargs):
        raise RepositoryNotFoundError("404 Client Error", response=response)

    monkeypatch.setattr(huggingface_hub, "hf_hub_download", missing)
    with pytest.raises(HubRepositoryError, match="there is no repository 'org/y' on the Hugging Face Hub"):
        hub_snapshot("hf-hub:org/y")


def test_unknown_tags_and_models_without_weights_say_what_there_is():
    with pytest.raises(ValueError, match="has no weights tagged 'in1k'; its tags: augreg_in21k_ft_in1k, augreg_in21k"):
        vitkit.create_model("vit_tiny_patch16_224", pretrained="in1k")
    with pytest.raises(ValueError, match="no weights are published for botnet50: "):
        vitkit.create_model("botnet50", pretrained=True)
    with pytest.raises(ValueError, match="expected hf-hub:ORG/REPO"):
        vitkit.from_pretrained("hf-hub:")
    assert list_pretrained("deit_tiny*") == ["deit_tiny_distilled_patch16_224.fb_in1k", "deit_tiny_patch16_224.fb_in1k"]


def test_nothing_is_imported_or_downloaded_until_asked():
    import subprocess
    import sys

    code = "import sys, vitkit; vitkit.create_model('vit_tiny_patch16_224'); print('huggingface_hub' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"


def test_table_sizes_are_the_files_to_download(timm_vit):
    """A timm repository's size: its model.safetensors as timm writes it (the tensors in float32, a small header);
    a torchvision file's: torchvision's own record (tests/weights/test_published_table.py)."""
    _, folder = timm_vit
    written = (folder / "model.safetensors").stat().st_size / 1e6
    assert math.isclose(vitkit.weights.download_mb("vit_tiny_patch16_224"), written, abs_tol=0.05)


def test_without_network_the_cache_is_read_at_once_and_the_error_says_why(tmp_path, monkeypatch):
    """Not offline by setting, but the Hub's name does not resolve: huggingface_hub is asked for the cache only (no
    retries of a connection that cannot be made), and the error names the cause; behind an HTTPS proxy, which
    resolves the name itself, the network is tried."""
    import socket

    import huggingface_hub
    from huggingface_hub.errors import LocalEntryNotFoundError

    from vitkit.weights import hub

    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)
    for name in ("HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy"):
        monkeypatch.delenv(name, raising=False)

    def no_dns(host, *args, **kwargs):
        raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")

    asked = []

    def download(*args, **kwargs):
        asked.append(kwargs.get("local_files_only"))
        raise LocalEntryNotFoundError("not in the cache")

    monkeypatch.setattr(socket, "getaddrinfo", no_dns)
    monkeypatch.setattr(huggingface_hub, "hf_hub_download", download)
    hub.unreachable_hub.cache_clear()
    hub._snapshot.cache_clear()
    with pytest.raises(NotCached, match=r"the Hub could not be reached: its address huggingface.co does not resolve"):
        hub_snapshot("hf-hub:org/none")
    assert asked == [True]
    monkeypatch.setenv("HTTPS_PROXY", "http://proxy.example:3128")
    hub.unreachable_hub.cache_clear()
    with pytest.raises(NotCached):
        hub_snapshot("hf-hub:org/other")
    assert asked == [True, False]
    hub.unreachable_hub.cache_clear()  # the next test asks again

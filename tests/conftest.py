import os

import huggingface_hub.constants
import pytest
import torch


@pytest.fixture(autouse=True, scope="session")
def one_thread_per_worker():
    """Under pytest-xdist every worker takes one core: torch threads beyond that only spin against each other."""
    if os.environ.get("PYTEST_XDIST_WORKER"):
        torch.set_num_threads(1)
    yield


@pytest.fixture(autouse=True, scope="session")
def own_cache(tmp_path_factory):
    """What vitkit measures about the machine (`vitkit.analysis.precision.cache_dir`) goes to a folder of the
    run's: the user's cache is neither read nor written."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("VITKIT_CACHE", str(tmp_path_factory.mktemp("vitkit_cache")))
        yield


@pytest.fixture(scope="module")
def hub_offline():
    """No Hub look-ups while a module builds transformers models offline (its tests use this fixture through
    `pytestmark`): transformers reads huggingface_hub's flag on every call."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("HF_HUB_OFFLINE", "1")
        patch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
        yield


@pytest.fixture
def native_bf16(monkeypatch):
    """Attention's dispatch as on a CPU with bf16 instructions and no AMX tiles (AVX512-BF16), on whatever CPU runs
    the test: the probe's timings as measured on a Zen 4 (`vitkit.kernels.probe.cpu_bf16_attention`: the explicit
    product faster both ways), so that the paths `auto` takes only there are checked everywhere (on other CPUs they
    are slow, not wrong)."""
    from vitkit.kernels import probe

    zen4 = probe.AttentionTimes(fused=5.16e-3, explicit=3.00e-3, fused_grad=24.7e-3, explicit_grad=9.40e-3)
    monkeypatch.setattr(probe, "cpu_bf16_attention", lambda: zen4)


class HubCache:
    """A Hugging Face cache in a temporary HF_HOME, in huggingface_hub's documented layout (models--ORG--NAME with
    refs/, blobs/ named by their content's sha256, snapshots/COMMIT/ linking to them), and a torch.hub folder."""

    def __init__(self, root):
        self.hub = root / "hf" / "hub"
        self.torch_dir = root / "torch"

    def put(
        self,
        repo: str,
        folder,
        commit: str = "0123456789abcdef0123456789abcdef01234567",
        ref: str = "main",
        absent: tuple[str, ...] = (),
    ):
        """Every file of `folder` as the repository `repo` at `commit` (`ref` pointing there), and the files named in
        `absent` marked as known not to exist there (`.no_exist/COMMIT/NAME`, as huggingface_hub records a 404);
        the snapshot folder."""
        import hashlib

        root = self.hub / f"models--{repo.replace('/', '--')}"
        (root / "refs").mkdir(parents=True, exist_ok=True)
        (root / "refs" / ref).write_text(commit)
        snapshot = root / "snapshots" / commit
        snapshot.mkdir(parents=True, exist_ok=True)
        (root / "blobs").mkdir(exist_ok=True)
        for path in sorted(folder.iterdir()):
            data = path.read_bytes()
            blob = root / "blobs" / hashlib.sha256(data).hexdigest()
            blob.write_bytes(data)
            link = snapshot / path.name
            link.unlink(missing_ok=True)
            link.symlink_to(os.path.relpath(blob, snapshot))
        for name in absent:
            (root / ".no_exist" / commit).mkdir(parents=True, exist_ok=True)
            (root / ".no_exist" / commit / name).touch()
        return snapshot

    def put_torch(self, name: str, data: bytes):
        """A file in torch.hub's checkpoints folder; its path."""
        path = self.torch_dir / "checkpoints" / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
        return path


@pytest.fixture
def hub_cache(tmp_path, monkeypatch):
    """An empty Hugging Face cache (HF_HOME in a temporary folder) and torch.hub folder, offline (HF_HUB_OFFLINE=1,
    which stops vitkit's torch.hub downloads too): `HubCache.put` fills it."""
    cache = HubCache(tmp_path)
    cache.hub.mkdir(parents=True)
    monkeypatch.setenv("HF_HOME", str(cache.hub.parent))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(cache.hub))
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(torch.hub, "_hub_dir", str(cache.torch_dir))
    return cache


def nudge(model, seed: int = 0):
    """Every floating tensor of `model` moved off its initial value (init symmetries hide wrong norms and heads);
    the model, in eval mode."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for t in model.state_dict().values():
            if t.is_floating_point():
                t.add_(torch.randn(t.shape, generator=g) * 0.02)
    return model.eval()


@pytest.fixture(name="nudge")
def nudge_fixture():
    """`nudge(model, seed=0)`: every floating tensor moved off its initial value."""
    return nudge


@pytest.fixture(scope="session")
def timm_vit(tmp_path_factory):
    """timm's vit_tiny_patch16_224 with random weights, written by timm as its Hub repositories hold it
    (`timm.models._hub.save_for_hf`): (the model, the folder)."""
    import timm
    from timm.models._hub import save_for_hf

    torch.manual_seed(0)
    model = nudge(timm.create_model("vit_tiny_patch16_224.augreg_in21k_ft_in1k"))
    folder = tmp_path_factory.mktemp("timm") / "repo"
    save_for_hf(model, folder, safe_serialization=True)
    return model, folder


@pytest.fixture(scope="session")
def hf_deformable(tmp_path_factory):
    """A small transformers Deformable DETR (box refinement, COCO's 91 labels named) with random weights and an image
    processor's normalisation, written by transformers: (the model, the folder)."""
    import json

    import transformers

    torch.manual_seed(0)
    backbone = transformers.ResNetConfig(
        layer_type="bottleneck", depths=[1, 1, 1, 1], embedding_size=16, hidden_sizes=[64, 128, 256, 512],
        out_features=["stage2", "stage3", "stage4"],
    )  # fmt: skip
    labels = {i: f"thing {i}" for i in range(91)}
    config = transformers.DeformableDetrConfig(
        d_model=64, encoder_layers=1, decoder_layers=2, encoder_attention_heads=4, decoder_attention_heads=4,
        encoder_ffn_dim=64, decoder_ffn_dim=64, encoder_n_points=2, decoder_n_points=2, num_queries=8,
        backbone_config=backbone, with_box_refine=True, id2label=labels, attn_implementation="eager",
    )  # fmt: skip
    model = nudge(transformers.DeformableDetrForObjectDetection(config))
    folder = tmp_path_factory.mktemp("hf") / "repo"
    model.save_pretrained(folder)
    processor = {"do_normalize": True, "image_mean": [0.45, 0.46, 0.47], "image_std": [0.2, 0.21, 0.22]}
    (folder / "preprocessor_config.json").write_text(json.dumps(processor))
    return model, folder


@pytest.fixture
def point_table(monkeypatch):
    """`point_table(name, source, config=None, tag=True)`: the registered model `name` with its published weights
    `tag` (True: the default) moved to `source` (a small repository or file the test put in its caches) as its
    only ones and, given, its config replaced by `config` (that repository's), until the test ends."""
    import dataclasses

    from vitkit.models import registry

    def point(name: str, source: str, config=None, tag: bool | str = True) -> None:
        entry, published = registry.published_weights(name, tag)
        moved = dataclasses.replace(published, source=source)
        changes = {"pretrained": (moved,)} | ({"config": config} if config is not None else {})
        monkeypatch.setitem(registry._MODELS, entry.name, dataclasses.replace(entry, **changes))

    return point


@pytest.fixture
def fake_time_step(monkeypatch, tmp_path):
    """`fake_time_step(times)`: a stand-in for `vitkit.analysis.precision.time_step` that runs the step it is given
    once in each precision (the real forwards run: fp32 as round 0, bf16 as round 1) and returns `times`; its `ran`
    lists the precisions run, bf16 as True. The test gets a cache of its own: no step timed by another is read."""
    monkeypatch.setenv("VITKIT_CACHE", str(tmp_path / "vitkit_cache"))

    def make(times):
        def fake(step, rounds=3):
            for i, bf16 in enumerate((False, True)):
                step(bf16, i)
                fake.ran.append(bf16)
            return times

        fake.ran = []
        return fake

    return make

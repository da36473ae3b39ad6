"""The memory preflight: estimates against the memory a real step takes (one process, and one process of an FSDP
run), the refusal and its ways out, the override, and the available memory read from /proc and the cgroup files."""

import dataclasses
import math
import os
import re

import pytest
import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
from torch.profiler import ProfilerActivity
from torch.testing._internal.distributed.fake_pg import FakeStore

import vitkit
from vitkit.analysis import (
    MemoryWarning,
    NotEnoughMemory,
    PeakMemory,
    SettingNames,
    available,
    available_memory,
    check_memory,
    estimate_memory,
    preflight,
)
from vitkit.analysis.memory import allocated_peak
from vitkit.models.registry import model_entry
from vitkit.train import create_optimizer

GiB = 2**30


def loss_of(outputs):
    """A scalar that every output takes part in: logits, or a detector's predictions and auxiliary outputs."""
    if isinstance(outputs, torch.Tensor):
        return outputs.float().logsumexp(-1).mean()
    parts = [outputs["pred_logits"], outputs["pred_boxes"]]
    parts += [t for aux in outputs["aux_outputs"] for t in aux.values()]
    return sum(t.float().mean() for t in parts)


def training_step(model, batch, size, precision):
    """A training step in `vitkit train`'s order (forward, zero_grad, backward, AdamW), with its optimizer and batch
    made beforehand."""
    optimizer = create_optimizer(model, lr=1e-4, weight_decay=0.05)
    x = torch.randn(batch, model.config.in_chans, size, size)

    def step():
        with torch.autocast("cpu", torch.bfloat16, enabled=precision == "bf16"):
            loss = loss_of(model(x))
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()

    return step


def measured_training_peak(model, batch, size, precision):
    """Peak extra memory of two training steps: the second step runs with the optimizer state the first one made
    and the first one's gradients."""
    step = training_step(model, batch, size, precision)
    with PeakMemory() as memory:
        step()
        step()
    return memory.peak


VIT = ("vit_small_patch16_224", {"depth": 2}, 96, 4)
SWIN = ("swin_tiny_patch4_window7_224", {"depths": (2, 2, 2, 2)}, 224, 1)
BOTNET = ("botnet26t_256", {}, 128, 2)
DETR = ("detr_tiny", {}, 96, 2)  # DETR's dropout (0.1) after attention, in the feed-forward and on the weights
DEFORMABLE = ("deformable_detr_digits", {}, 96, 2)  # trains on the levelwise path (measured: 1.2% and 3.8% under)
# every kind of dropout: on the tokens after the position embedding, on the weights, after the projections and in
# the MLP, stochastic depth, before the head
DROPOUT = {"drop_rate": 0.1, "attn_drop_rate": 0.1, "drop_path_rate": 0.1}
VIT_DROPOUT = ("vit_small_patch16_224", {"depth": 2, **DROPOUT}, 96, 4)
SWIN_DROPOUT = ("swin_tiny_patch4_window7_224", {"depths": (2, 2, 2, 2), **DROPOUT}, 224, 1)


def case_id(name, overrides):
    extra = "-math" if "attn_backend" in overrides else "-dropout" if "drop_rate" in overrides else ""
    return name.split("_")[0] + extra


@pytest.mark.parametrize(
    ("case", "precision", "checkpointing", "tolerance"),
    [
        (VIT, "fp32", False, 0.01),
        ((VIT[0], {**VIT[1], "attn_backend": "math"}, *VIT[2:]), "fp32", False, 0.01),
        (VIT, "bf16", False, 0.03),
        (VIT, "fp32", True, 0.01),
        (SWIN, "fp32", False, 0.05),
        (SWIN, "fp32", True, 0.06),
        (BOTNET, "fp32", False, 0.03),
        (DETR, "fp32", False, 0.03),
        (DETR, "fp32", True, 0.03),
        (DETR, "bf16", False, 0.05),
        (DEFORMABLE, "fp32", False, 0.03),
        (DEFORMABLE, "bf16", False, 0.05),
        (VIT_DROPOUT, "fp32", False, 0.01),
        (VIT_DROPOUT, "bf16", False, 0.03),
        (SWIN_DROPOUT, "fp32", False, 0.02),
    ],
    ids=lambda v: case_id(*v[:2]) if isinstance(v, tuple) else None,
)
def test_training_estimate_against_measured_peak(case, precision, checkpointing, tolerance):
    name, overrides, size, batch = case
    torch.manual_seed(0)
    model = vitkit.create_model(name, img_size=size, **overrides).train()
    if checkpointing:
        model.set_grad_checkpointing(True)
    estimate = estimate_memory(model, size, batch, training=True, precision=precision, grad_checkpointing=checkpointing)
    measured = measured_training_peak(model, batch, size, precision)
    # weights and input existed before the measurement; the optimizer state and one step's allocations did not
    assert estimate.resident_bytes == estimate.weights_bytes
    assert abs(estimate.optimizer_bytes + estimate.step_bytes - measured) <= tolerance * measured


def test_checkpointing_lowers_the_estimate_and_ema_adds_a_copy_of_the_weights():
    plain = estimate_memory("vit_base_patch16_224", 384, 8, training=True)
    checkpointed = estimate_memory("vit_base_patch16_224", 384, 8, training=True, grad_checkpointing=True)
    assert checkpointed.step_bytes < plain.step_bytes / 3  # 12 blocks: their inputs and one block recomputed
    assert checkpointed.weights_bytes == plain.weights_bytes and checkpointed.optimizer_bytes == plain.optimizer_bytes
    assert plain.optimizer_bytes == 2 * plain.weights_bytes  # AdamW's two moments (ViT has no buffers)
    ema = estimate_memory("vit_base_patch16_224", 384, 8, training=True, ema=True)
    assert ema.optimizer_bytes == 3 * plain.weights_bytes


@pytest.mark.parametrize(
    ("name", "size", "precision", "tolerance"),
    [
        ("vit_small_patch16_224", 224, "fp32", 0.0),  # the activation peak (the other families: test_profile.py)
        ("vit_small_patch16_224", 224, "bf16", 0.01),  # autocast under no_grad keeps bf16 copies of the weights
    ],
)
def test_inference_estimate_against_measured_peak(name, size, precision, tolerance):
    torch.manual_seed(0)
    model = vitkit.create_model(name).eval()
    x = torch.randn(2, 3, size, size)
    with torch.no_grad(), torch.autocast("cpu", torch.bfloat16, enabled=precision == "bf16"), PeakMemory() as memory:
        model(x)
    estimate = estimate_memory(model, size, 2, training=False, precision=precision)
    assert estimate.optimizer_bytes == 0
    assert abs(estimate.step_bytes - memory.peak) <= tolerance * memory.peak


# the detectors on Swin and ViT backbones: built with a block per backbone stage (what each kind of layer is
# estimated by is the same; the full backbones at 800x1216 and 644x644 take a minute)
def _one_block_per_stage(name: str) -> dict:
    body = model_entry(model_entry(name).config.backbone).config
    return {"backbone_args": {"depths": (1,) * len(body.depths)} if hasattr(body, "depths") else {"depth": 1}}


SHORT_BACKBONES = {
    name: _one_block_per_stage(name)
    for name in vitkit.list_models("deformable_detr_*")
    if model_entry(name).config.backbone != "resnet"
}


def _one_per_kind() -> list[str]:
    """A variant of each family and of each detector backbone: each family's first and last by name, every detector
    on a Swin or ViT, and the full-size ResNet-50 DETRs. The estimate's code is the same for every size of a family,
    and full-size variants take seconds each to trace."""
    chosen: dict[str, None] = {}
    for fam in {model_entry(n).family for n in vitkit.list_models()}:
        names = [n for n in vitkit.list_models() if model_entry(n).family == fam]
        chosen.update(dict.fromkeys([names[0], names[-1]]))
    chosen.update(dict.fromkeys([*SHORT_BACKBONES, "detr_resnet50", "deformable_detr_resnet50"]))  # full-size R50s
    return sorted(chosen)


@pytest.mark.parametrize("name", _one_per_kind())
def test_every_model_is_estimated_without_allocating(name):
    """Any family, detectors included: a name is estimated on the meta device, the built model the same way."""
    source = name
    if name in SHORT_BACKBONES:  # a built model, estimated as a name is
        with torch.device("meta"):
            source = vitkit.create_model(name, **SHORT_BACKBONES[name])
    with PeakMemory() as memory:  # counts every tensor with storage made here (meta tensors have none)
        one = estimate_memory(source, None, 1, training=True)
        two = estimate_memory(source, None, 2, training=True)
        checkpointed = estimate_memory(source, None, 2, training=True, grad_checkpointing=True)
        sharded = estimate_memory(source, None, 1, training=True, strategy="fsdp", world=8)
    assert memory.peak == 0
    with torch.device("meta"):
        model = vitkit.create_model(name, **SHORT_BACKBONES.get(name, {}))
    assert estimate_memory(model, None, 2, training=True) == dataclasses.replace(two, model=type(model).__name__)
    assert one.weights_bytes == sum(p.numel() * 4 for p in model.parameters()) + sum(
        b.numel() * b.element_size() for b in model.buffers()
    )
    assert one.resident_bytes == 0  # nothing of a named model is loaded yet
    assert 0 < one.step_bytes < two.step_bytes
    assert checkpointed.step_bytes < two.step_bytes
    assert sharded.weights_bytes < one.weights_bytes / 4 and sharded.gathered_bytes > 0  # every model has units
    inference = estimate_memory(source, None, 2, training=False)
    assert 0 < inference.step_bytes < two.step_bytes and inference.optimizer_bytes == 0


def test_estimating_leaves_the_models_checkpointing_as_it_was():
    model = vitkit.create_model("vit_tiny_patch16_224", depth=2)
    estimate_memory(model, None, 2, training=True, grad_checkpointing=True)
    assert not any("forward" in m.__dict__ for m in model.modules())
    model.set_grad_checkpointing(True)
    estimate_memory(model, None, 2, training=True, grad_checkpointing=True)
    assert all("forward" in block.__dict__ for block in model.blocks)


@pytest.fixture
def little_memory(monkeypatch):
    """The machine seen with 2 GiB available."""
    monkeypatch.setattr(preflight, "available_memory", lambda device="cpu": 2 * GiB)
    return 2 * GiB


def test_huge_training_run_is_refused_with_the_figures_and_the_ways_out(little_memory):
    with pytest.raises(NotEnoughMemory) as caught:
        check_memory("vit_base_patch16_224", 4096, 64, training=True)
    message, estimate = str(caught.value), caught.value.estimate
    assert isinstance(caught.value, ValueError)  # the commands report it as one, with exit code 2
    assert estimate.available_bytes == little_memory and not estimate.fits
    assert estimate.total_bytes > 1000 * GiB
    assert f"needs about {estimate.total_bytes / GiB:.1f} GiB of cpu memory" in message
    assert f"activations, gradients and backward {estimate.step_bytes / GiB:.1f} GiB" in message
    assert "but only 2.0 GiB is available" in message
    # not even one 4096x4096 image fits in 2 GiB, checkpointed or not: only the image size is left to change
    assert "Ways out: a smaller img_size" in message
    assert "batch=" not in message and "grad_checkpointing" not in message
    assert message.endswith("To run anyway, pass allow=True.")
    assert "\n" not in message


def fits(name, size, batch, available, **kwargs):
    return estimate_memory(name, size, batch, **kwargs).needed_bytes <= preflight.SAFETY * available


def test_the_largest_batch_that_fits_is_computed(little_memory):
    with pytest.raises(NotEnoughMemory) as caught:
        check_memory("vit_base_patch16_224", 224, 64, training=True, names=SettingNames("--batch-size"))
    message = str(caught.value)
    largest = int(message.split("--batch-size ")[1].split()[0])
    assert fits("vit_base_patch16_224", 224, largest, little_memory, training=True)
    assert not fits("vit_base_patch16_224", 224, largest + 1, little_memory, training=True)
    assert f"--batch-size {largest} (the largest batch that fits)" in message
    # checkpointing: a larger batch fits, computed the same way
    checkpointed = int(re.search(r"grad_checkpointing=True with --batch-size (\d+)", message).group(1))
    assert checkpointed > largest
    assert fits("vit_base_patch16_224", 224, checkpointed, little_memory, training=True, grad_checkpointing=True)
    assert not fits(
        "vit_base_patch16_224", 224, checkpointed + 1, little_memory, training=True, grad_checkpointing=True
    )
    with pytest.raises(NotEnoughMemory) as caught:
        check_memory("vit_base_patch16_224", 1024, 64, training=False)
    assert "grad_checkpointing" not in str(caught.value)  # not a way out for inference


def test_processes_sharing_the_machine_must_fit_together(monkeypatch):
    one = estimate_memory("vit_base_patch16_224", 224, 16, training=True)
    room = int(one.needed_bytes / preflight.SAFETY * 2.5)  # two runs fit, three do not
    monkeypatch.setattr(preflight, "available_memory", lambda device="cpu": room)
    assert check_memory("vit_base_patch16_224", 224, 16, training=True, processes=2).processes == 2
    with pytest.raises(NotEnoughMemory) as caught:
        check_memory("vit_base_patch16_224", 224, 16, training=True, processes=3, names=SettingNames("--batch-size"))
    message = str(caught.value)
    assert f"in each of 3 processes on this machine, {3 * one.needed_bytes / GiB:.1f} GiB more in all" in message
    largest = int(message.split("--batch-size ")[1].split()[0])
    plan = preflight.SAFETY * room
    assert 3 * estimate_memory("vit_base_patch16_224", 224, largest, training=True).needed_bytes <= plan
    assert 3 * estimate_memory("vit_base_patch16_224", 224, largest + 1, training=True).needed_bytes > plan


def test_the_models_own_size_is_offered_when_it_fits(monkeypatch):
    own = estimate_memory("vit_base_patch16_224", 224, 16, training=False)
    monkeypatch.setattr(preflight, "available_memory", lambda device="cpu": int(own.needed_bytes / 0.9 * 1.5))
    with pytest.raises(NotEnoughMemory, match=r"--img-size 224 \(the model's own size\)"):
        check_memory("vit_base_patch16_224", 1024, 16, training=False, names=SettingNames(img_size="--img-size"))


def test_allow_only_warns(little_memory):
    with pytest.warns(MemoryWarning, match=r"needs about .* Running anyway \(allow=True\)"):
        estimate = check_memory("vit_base_patch16_224", 4096, 64, training=True, allow=True)
    assert not estimate.fits


def test_a_run_that_fits_passes_quietly(little_memory, recwarn):
    estimate = check_memory("vit_tiny_patch16_224", None, 8, training=True)
    assert estimate.fits and estimate.available_bytes == little_memory
    assert not recwarn.list


def test_weights_already_loaded_are_not_asked_for_again(monkeypatch):
    model = vitkit.create_model("vit_base_patch16_224", depth=2)
    estimate = estimate_memory(model, None, 1, training=False)
    assert estimate.resident_bytes == estimate.weights_bytes > 0
    assert estimate.needed_bytes == estimate.total_bytes - estimate.weights_bytes
    # between the two totals: refused by name (weights to load), accepted for the loaded model
    available = int((estimate.total_bytes - estimate.weights_bytes / 2) / 0.9)
    monkeypatch.setattr(preflight, "available_memory", lambda device="cpu": available)
    check_memory(model, None, 1, training=False)
    with pytest.raises(NotEnoughMemory):
        check_memory("vit_base_patch16_224", None, 1, training=False, overrides={"depth": 2})


def write(path, text):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


@pytest.mark.parametrize("version", ["v1", "v2"])
def test_available_memory_is_the_smaller_of_meminfo_and_the_cgroup_room(tmp_path, monkeypatch, version):
    write(tmp_path / "meminfo", "MemTotal:  16000000 kB\nMemAvailable:  8000000 kB\n")
    if version == "v2":
        write(tmp_path / "self", "0::/job\n")
        group = tmp_path / "fs" / "job"
        write(group / "memory.max", f"{4 * GiB}\n")
        write(group / "memory.current", f"{3 * GiB}\n")
        write(group / "memory.stat", f"anon 1\ninactive_file {GiB // 2}\n")
    else:
        write(tmp_path / "self", "5:memory:/job\n4:cpu:/\n")
        group = tmp_path / "fs" / "memory" / "job"
        write(group / "memory.limit_in_bytes", f"{4 * GiB}\n")
        write(group / "memory.usage_in_bytes", f"{3 * GiB}\n")
        write(group / "memory.stat", f"inactive_file 1\ntotal_inactive_file {GiB // 2}\n")
    monkeypatch.setattr(available, "MEMINFO", tmp_path / "meminfo")
    monkeypatch.setattr(available, "SELF_CGROUP", tmp_path / "self")
    monkeypatch.setattr(available, "CGROUP_ROOT", tmp_path / "fs")
    assert available_memory("cpu") == GiB + GiB // 2  # 4 GiB limit - 3 GiB used + 0.5 GiB reclaimable cache
    write(group / ("memory.max" if version == "v2" else "memory.limit_in_bytes"), "max\n")  # no limit
    assert available_memory("cpu") == 8000000 * 1024


def test_available_memory_of_this_machine():
    available = available_memory("cpu")
    total = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    assert 0 < available <= total
    if not torch.cuda.is_available():
        assert available_memory("cuda") is None  # unknown: nothing is refused


def test_bad_arguments():
    with pytest.raises(ValueError, match="batch must be >= 1, got 0"):
        check_memory("vit_tiny_patch16_224", None, 0, training=True)
    with pytest.raises(ValueError, match=r"precision must be one of \['bf16', 'fp32'\], got 'fp16'"):
        estimate_memory("vit_tiny_patch16_224", None, 1, training=True, precision="fp16")
    with pytest.raises(ValueError, match="a memory estimate needs a vitkit model"):
        estimate_memory(nn.Linear(2, 2), None, 1, training=False)


@pytest.mark.parametrize("name", ["vit_small_patch16_224", "swin_tiny_patch4_window7_224", "botnet26t_256"])
def test_captured_attention_maps_are_counted(name):
    """`vitkit attention`'s pass: every layer's weights kept to the end, each from the operator that forms it."""
    torch.manual_seed(0)
    model = vitkit.create_model(name).eval()
    size = model.config.img_size
    x = torch.randn(1, 3, size, size)
    with vitkit.capture_attention(model) as maps, torch.no_grad(), PeakMemory() as memory:
        model(x)
    estimate = estimate_memory(model, size, 1, training=False, capture_attention=True)
    plain = estimate_memory(model, size, 1, training=False)
    captured = sum(m.numel() * m.element_size() for m in maps.values())
    assert plain.step_bytes <= estimate.step_bytes <= plain.step_bytes + captured  # the peak may come earlier
    assert abs(estimate.step_bytes - memory.peak) <= 0.01 * memory.peak


def test_fsdp_keeps_a_share_of_the_states_and_gathers_one_unit_at_a_time():
    """ViT-S/16 with 4 blocks over 4 processes, bf16, from the parameters' shapes: FSDP keeps ceil(rows / 4) rows of
    each parameter, its gradient and its two AdamW moments in each process, and the peak (the end of forward) holds
    the root's parameters and the last block's, gathered in bf16, beside its all-gather buffer."""
    model = vitkit.create_model("vit_small_patch16_224", depth=4)
    ddp = estimate_memory(model, None, 8, training=True, precision="bf16")
    fsdp = estimate_memory(model, None, 8, training=True, precision="bf16", strategy="fsdp", world=4)

    def kept(p):  # elements of `p` one process keeps: dim 0 in 4 chunks of ceil(rows / 4), the last ones padded
        return math.ceil(p.shape[0] / 4) * (p.numel() // p.shape[0])

    shards = 4 * sum(kept(p) for p in model.parameters())  # fp32
    C = 384
    unit = 2 * (12 * C * C + 13 * C)  # a block in bf16: qkv, proj, fc1, fc2 (MLP ratio 4), two LayerNorms
    assert all(2 * sum(p.numel() for p in block.parameters()) == unit for block in model.blocks)  # C % 4 == 0
    root = 2 * 4 * sum(kept(p) for name, p in model.named_parameters() if not name.startswith("blocks."))
    assert fsdp.weights_bytes == fsdp.resident_bytes == shards and fsdp.optimizer_bytes == 2 * shards
    # a quarter of the whole model's, and the one-row tensors (class token, position table) that every process
    # keeps whole: 3% more here
    assert ddp.weights_bytes / 4 < shards < 1.03 * ddp.weights_bytes / 4
    assert fsdp.gradient_bytes == shards  # the previous step's gradient shards, freed by zero_grad
    assert fsdp.gathered_bytes == root + 2 * unit
    # the same activations as the whole model's step at its peak, which also holds every gradient and autocast's
    # bf16 copies of the linear and convolution weights (under FSDP the gathered parameters are bf16 already)
    copies = 2 * sum(p.numel() for m in model.modules() if isinstance(m, nn.Linear | nn.Conv2d) for p in m.parameters())
    assert ddp.gradient_bytes == ddp.weights_bytes and ddp.gathered_bytes == 0
    activations = fsdp.step_bytes - fsdp.gradient_bytes - fsdp.gathered_bytes
    assert abs(activations - (ddp.step_bytes - ddp.gradient_bytes - copies)) <= 0.001 * activations
    # what is held for the parameters: a quarter of the whole model's (weights, two moments, gradients) and the
    # gathered units
    whole = ddp.weights_bytes + ddp.optimizer_bytes + ddp.gradient_bytes
    held = fsdp.weights_bytes + fsdp.optimizer_bytes + fsdp.gradient_bytes + fsdp.gathered_bytes
    assert held == 4 * shards + root + 2 * unit and abs(held - whole / 4 - root - 2 * unit) < 0.03 * whole / 4
    assert (fsdp.strategy, fsdp.world, fsdp.sharded) == ("fsdp", 4, True)


def test_ddp_and_a_single_process_are_estimated_as_before():
    model = vitkit.create_model("vit_small_patch16_224", depth=2, img_size=96)
    plain = estimate_memory(model, None, 4, training=True)
    assert (plain.strategy, plain.world, plain.sharded) == ("ddp", 1, False)
    assert estimate_memory(model, None, 4, training=True, world=8) == dataclasses.replace(plain, world=8)
    single = estimate_memory(model, None, 4, training=True, strategy="fsdp")  # one process holds the whole model
    assert single == dataclasses.replace(plain, strategy="fsdp") and not single.sharded
    with pytest.raises(ValueError, match=r"strategy must be one of \['ddp', 'fsdp'\], got 'zero'"):
        estimate_memory(model, None, 4, training=True, strategy="zero")
    with pytest.raises(ValueError, match="world must be >= 1, got 0"):
        estimate_memory(model, None, 4, training=True, world=0)
    with pytest.raises(ValueError, match="strategy 'fsdp' is a training strategy"):
        estimate_memory(model, None, 4, training=False, strategy="fsdp", world=2)
    with pytest.raises(ValueError, match=r"processes on this machine \(4\) cannot exceed the processes of the run"):
        check_memory(model, None, 4, training=True, strategy="fsdp", world=2, processes=4)


FLAGS = SettingNames("--batch-size", "--img-size", "--grad-checkpointing", "--ignore-memory-check", "--strategy")


def refused(monkeypatch, available, *args, **kwargs) -> str:
    monkeypatch.setattr(preflight, "available_memory", lambda device="cpu": available)
    with pytest.raises(NotEnoughMemory) as caught:
        check_memory(*args, **kwargs)
    return str(caught.value)


def fits_fsdp(world, available, processes=1, **kwargs):
    """Whether `processes` on one device of `available` bytes fit ViT-L at batch 4 under fsdp over `world`."""
    estimate = estimate_memory("vit_large_patch14_224", None, 4, training=True, strategy="fsdp", world=world, **kwargs)
    return processes * estimate.needed_bytes <= preflight.SAFETY * available


def test_a_ddp_refusal_names_fsdp_over_the_fewest_processes_that_fit(monkeypatch):
    # ViT-L/14 at batch 4 needs 6 GiB whole; on a 4 GiB GPU neither a smaller batch nor checkpointing fits
    message = refused(monkeypatch, 4 * GiB, "vit_large_patch14_224", None, 4, training=True, device="cuda", names=FLAGS)
    found = re.search(r"--strategy fsdp with (\d+) or more processes \(about (\d+\.\d) GiB each\)\.", message)
    fewest = int(found.group(1))
    assert fits_fsdp(fewest, 4 * GiB, device="cuda") and not fits_fsdp(fewest - 1, 4 * GiB, device="cuda")
    each = estimate_memory("vit_large_patch14_224", None, 4, training=True, strategy="fsdp", world=fewest)
    assert found.group(2) == f"{each.total_bytes / GiB:.1f}"
    assert "needs about 6.0 GiB of cuda memory (weights 1.1 GiB" in message  # the run's own figures as before
    # a run that has enough processes already only needs the strategy; the library's spelling
    message = refused(monkeypatch, 4 * GiB, "vit_large_patch14_224", None, 4, training=True, device="cuda", world=8)
    each = estimate_memory("vit_large_patch14_224", None, 4, training=True, strategy="fsdp", world=8)
    assert f'strategy="fsdp" (over the run\'s 8 processes: about {each.total_bytes / GiB:.1f} GiB each)' in message
    # not offered where the caller has no such setting, nor for inference
    names = dataclasses.replace(FLAGS, strategy=None)
    message = refused(monkeypatch, 4 * GiB, "vit_large_patch14_224", None, 4, training=True, device="cuda", names=names)
    assert "fsdp" not in message


def test_on_cpu_sharding_is_offered_over_machines_not_more_processes_on_this_one(monkeypatch):
    message = refused(monkeypatch, 4 * GiB, "vit_large_patch14_224", None, 4, training=True, names=FLAGS)
    fewest = int(re.search(r"--strategy fsdp with (\d+) or more processes, one per machine", message).group(1))
    assert fits_fsdp(fewest, 4 * GiB) and not fits_fsdp(fewest - 1, 4 * GiB)
    assert "more processes on this machine do not help, as each holds its own activations" in message
    assert not fits_fsdp(fewest, 4 * GiB, processes=fewest)  # all of them here would not fit: said so
    # 4 processes here: sharding over them fits when their states are shared
    four = estimate_memory("vit_large_patch14_224", None, 4, training=True, strategy="fsdp", world=4)
    room = int(4 * four.needed_bytes / preflight.SAFETY) + 1
    message = refused(
        monkeypatch, room, "vit_large_patch14_224", None, 4, training=True, processes=4, world=4, names=FLAGS
    )
    total = f"{4 * four.total_bytes / GiB:.1f} GiB on this machine"
    assert (
        f"--strategy fsdp (over the run's 4 processes: about {four.total_bytes / GiB:.1f} GiB each, {total})" in message
    )


def test_an_fsdp_refusal_gives_per_process_figures_and_more_processes(monkeypatch):
    message = refused(
        monkeypatch, 5 * GiB // 2, "vit_large_patch14_224", None, 4, training=True, device="cuda", strategy="fsdp",
        world=2, names=FLAGS,
    )  # fmt: skip
    two = estimate_memory("vit_large_patch14_224", None, 4, training=True, strategy="fsdp", world=2)
    assert message.startswith(
        f"vit_large_patch14_224 training at batch 4, 224x224, fp32, fsdp over 2 processes needs about "
        f"{two.total_bytes / GiB:.1f} GiB of cuda memory per process "
        f"(weight shards {two.weights_bytes / 2**20:.0f} MiB, optimizer state shards "
        f"{two.optimizer_bytes / GiB:.1f} GiB, activations, gradients and backward "
        f"{two.step_bytes / GiB:.1f} GiB (gathered units {two.gathered_bytes / 2**20:.0f} MiB)"
    )
    fewest = int(re.search(r"fsdp over (\d+) or more processes \(about", message).group(1))
    assert fits_fsdp(fewest, 5 * GiB // 2, device="cuda") and not fits_fsdp(fewest - 1, 5 * GiB // 2, device="cuda")


def test_only_train_offers_the_strategy_flag():
    from vitkit.cli.options import memory_flags
    from vitkit.perf.bench import MEMORY_NAMES

    assert memory_flags().strategy == "--strategy"  # vitkit train's
    assert memory_flags(batch="--batch", grad_checkpointing=None, strategy=None).strategy is None  # bench, profile
    assert MEMORY_NAMES.strategy is None and SettingNames().strategy == "strategy"


# A ViT whose parameters outweigh its activations (7 MB of weights, 0.1 MB of activations a block), so that what
# FSDP holds decides the peak: AdamW's state and the gradients sharded, the units gathered one at a time.
SHARDED_VIT = {"img_size": 32, "patch_size": 8, "embed_dim": 192, "depth": 4, "num_heads": 3, "num_classes": 10}


@pytest.mark.parametrize(("world", "rank", "precision"), [(2, 1, "fp32"), (4, 0, "bf16")])
def test_fsdp_estimate_against_the_measured_peak_of_one_process(world, rank, precision, tmp_path):
    """One process of an FSDP2 run, sharded as `vitkit train --strategy fsdp` does (each shard unit, then the root;
    bf16: FSDP's mixed precision under autocast): the peak of two AdamW steps against the estimate of the model
    before sharding.

    The process group is torch's FakeProcessGroup (what torchtitan estimates memory with): FSDP allocates, gathers
    into and frees its buffers as with Gloo or NCCL, only the collectives return at once. Under Gloo the measurement
    is not reliable: Gloo's worker thread sometimes drops the last reference to a buffer (the all-gather output FSDP
    frees after its copy-out in backward, the copy of the reduce-scatter input Gloo makes), and torch's CPU memory
    profiling sees only the frees of the profiled thread, so peaks of two processes varied by one or two units."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # the profiler sees the allocations of the thread it profiles, not those of helpers
    dist.init_process_group("fake", rank=rank, world_size=world, store=FakeStore())
    try:
        torch.manual_seed(0)
        model = vitkit.create_model("vit_tiny_patch16_224", **SHARDED_VIT).train()
        sharded, whole = (
            estimate_memory(model, None, 4, training=True, precision=precision, strategy=strategy, world=world)
            for strategy in ("fsdp", "ddp")
        )
        mixed = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
        policy = mixed if precision == "bf16" else MixedPrecisionPolicy()
        for unit in model.shard_units():
            fully_shard(unit, mp_policy=policy)
        fully_shard(model, mp_policy=policy)
        fully_shard.state(model)._lazy_init()  # else its first forward allocates the shards again
        step = training_step(model, 4, SHARDED_VIT["img_size"], precision)
        with torch.profiler.profile(activities=[ProfilerActivity.CPU], profile_memory=True) as profiler:
            step()
            step()
        measured = allocated_peak(profiler, tmp_path / "trace.json")
        shards = sum(p.to_local().numel() * p.element_size() for p in model.parameters())
    finally:
        dist.destroy_process_group()
        torch.set_num_threads(threads)
    # the weights already there are this process's shards (padded, so rank 0's are the largest)
    assert shards <= sharded.weights_bytes == sharded.resident_bytes
    assert sharded.weights_bytes - shards < 0.01 * shards
    # the optimizer state and the step's allocations, as for one process above: FSDP's buffers are sized exactly;
    # left out are small ones (AdamW's step counters, the bf16 copy of a shard before its all-gather, LayerNorm
    # weights cast to fp32 by autocast)
    assert abs(sharded.optimizer_bytes + sharded.step_bytes - measured) <= 0.01 * measured
    assert whole.optimizer_bytes + whole.step_bytes > 1.25 * measured  # a whole model's figures are far off

"""Sample order, sharding, seeded augmentation, channel conversion, normalisation and unreadable files."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from PIL import Image
from torch.utils.data import DistributedSampler
from torchvision.transforms import v2

from vitkit.data import (
    ArrayImages,
    EpochSampler,
    ImageFiles,
    TransformedImages,
    Unreadable,
    center_crop_share,
    collate,
    eval_transform,
    make_loader,
    normalize,
    preprocess,
    summarize_unreadable,
    train_transform,
)


@pytest.mark.parametrize("shuffle", [True, False])
@pytest.mark.parametrize("size,replicas", [(10, 1), (10, 3), (7, 2), (2, 5)])
def test_epoch_sampler_order_is_distributed_samplers(size, replicas, shuffle):
    for rank in range(replicas):
        for epoch in (0, 3):
            ours = EpochSampler(size, replicas, rank, shuffle=shuffle, seed=5)
            ours.set_epoch(epoch)
            reference = DistributedSampler(range(size), replicas, rank, shuffle=shuffle, seed=5)
            reference.set_epoch(epoch)
            assert [i for i, _ in ours] == list(reference)
            assert len(ours) == len(reference)


def test_epoch_sampler_resumes_inside_an_epoch_and_seeds_follow_samples():
    sampler = EpochSampler(20, 2, 1, seed=1)
    sampler.set_epoch(4)
    full = list(sampler)
    sampler.set_epoch(4, start=3)
    assert list(sampler) == full[3:] and len(sampler) == len(full) - 3
    # An image's augmentation seed depends on the epoch and the image, not on the process that draws it.
    other = EpochSampler(20, 2, 0, seed=1)
    other.set_epoch(4)
    seeds = dict(full) | dict(other)
    single = EpochSampler(20, 1, 0, seed=1)
    single.set_epoch(4)
    assert dict(single) == seeds
    single.set_epoch(5)
    assert dict(single) != seeds


@pytest.mark.parametrize("replicas", [1, 2, 3])
def test_grouped_batches_hold_one_group_and_share_a_step_seed(replicas):
    size, batch = 50, 4
    groups = [int(i % 5 == 0) for i in range(size)]  # 10 of group 1, 40 of group 0
    shares = []
    for rank in range(replicas):
        sampler = EpochSampler(size, replicas, rank, seed=3, batch_size=batch, groups=groups)
        sampler.set_epoch(2)
        shares.append(list(sampler))
        assert len(shares[-1]) == len(sampler)
        sampler.set_epoch(2, start=batch)  # a resumed epoch continues where it stopped
        assert list(sampler) == shares[-1][batch:]
    plain = EpochSampler(size, seed=3)
    plain.set_epoch(2)
    assert {i: s for share in shares for i, s, _ in share} == dict(plain)  # a sample's own seed is unchanged
    steps = [[share[i : i + batch] for i in range(0, len(share), batch)] for share in shares]
    mixed = 0
    for step in zip(*steps, strict=False):  # one step: a batch in each process
        step_seeds = {seed for samples in step for _, _, seed in samples}
        assert len(step_seeds) == 1  # one size for every image of the step
        mixed += any(len({groups[i] for i, _, _ in samples}) > 1 for samples in step)
    assert mixed <= 1  # only the last step mixes groups (the leftovers of each group)
    every = sorted(i for share in shares for i, _, _ in share)
    assert set(every) == set(range(size)) and len(every) == -(-size // replicas) * replicas
    ungrouped = EpochSampler(size, seed=3, batch_size=batch)
    ungrouped.set_epoch(2)
    assert sum(len({groups[i] for i, _, _ in list(ungrouped)[k : k + batch]}) > 1 for k in range(0, 48, batch)) > 3
    with pytest.raises(ValueError, match="groups needs a batch_size and one group per sample"):
        EpochSampler(size, groups=groups)


def test_eval_sharding_without_padding_covers_each_sample_once():
    shards = [EpochSampler(7, 3, rank, shuffle=False, pad=False) for rank in range(3)]
    assert sorted(i for shard in shards for i, _ in shard) == list(range(7))
    assert [len(shard) for shard in shards] == [3, 2, 2]


def _digits(n: int = 12) -> ArrayImages:
    rng = np.random.default_rng(0)
    return ArrayImages(rng.integers(0, 256, (n, 20, 20), dtype=np.uint8), np.arange(n) % 3, "random")


def test_augmentation_is_seeded_per_sample_and_leaves_the_global_rng_alone():
    images = TransformedImages(_digits(), train_transform((16, 16), 1, min_scale=0.3, hflip=0.5, randaugment=9))
    torch.manual_seed(0)
    state = torch.get_rng_state()
    first, label = images[(2, 123)]
    assert torch.equal(torch.get_rng_state(), state)
    assert torch.equal(images[(2, 123)][0], first) and label == 2
    assert not torch.equal(images[(2, 124)][0], first)
    assert first.shape == (1, 16, 16) and first.dtype == torch.uint8


def test_batches_do_not_depend_on_the_number_of_workers():
    images = TransformedImages(_digits(), train_transform((16, 16), 3, min_scale=0.3))
    batches = {}
    for workers in (0, 2):
        sampler = EpochSampler(len(images), seed=2)
        sampler.set_epoch(1)
        batches[workers] = [b.images for b in make_loader(images, sampler, 5, workers)]
    assert all(torch.equal(a, b) for a, b in zip(batches[0], batches[2], strict=True))


def _luma(rgb: np.ndarray) -> np.ndarray:
    """ITU-R 601-2 luma of (H, W, 3) uint8, rounded: the grey a 1-channel model sees."""
    return np.rint(rgb.astype(np.float64) @ np.array([0.299, 0.587, 0.114])).astype(np.int64)


@pytest.mark.parametrize("mode", ["L", "RGB", "P", "CMYK"])
def test_opaque_image_modes_become_the_models_channels(mode):
    rng = np.random.default_rng(1)
    image = Image.fromarray(rng.integers(0, 256, (6, 6, 3), dtype=np.uint8)).convert(mode)
    rgb = np.asarray(image.convert("RGB")).astype(np.int64)  # P: the palette looked up; CMYK: PIL's formula
    if mode == "P":
        palette = np.array(image.getpalette(), dtype=np.int64).reshape(-1, 3)
        np.testing.assert_array_equal(rgb, palette[np.asarray(image)])
    colour = eval_transform((6, 6), 3)(image).permute(1, 2, 0).numpy().astype(np.int64)
    grey = eval_transform((6, 6), 1)(image)[0].numpy().astype(np.int64)
    np.testing.assert_array_equal(colour, rgb)
    if mode == "L":
        np.testing.assert_array_equal(grey, np.asarray(image))
        assert (colour == grey[..., None]).all()  # grey repeated in R, G and B
    else:
        assert np.abs(grey - _luma(rgb.astype(np.uint8))).max() <= 1


@pytest.mark.parametrize("mode", ["RGBA", "LA", "PA"])
def test_transparent_images_are_composited_on_white(mode):
    rng = np.random.default_rng(2)
    pixels = rng.integers(0, 256, (6, 6, 4), dtype=np.uint8)
    pixels[0, :, 3], pixels[1, :, 3] = 0, 255  # a fully transparent row and an opaque one
    image = Image.fromarray(pixels).convert(mode)
    rgba = np.asarray(image.convert("RGBA")).astype(np.float64)
    alpha = rgba[..., 3:] / 255
    expected = rgba[..., :3] * alpha + 255 * (1 - alpha)  # over a white background
    out = eval_transform((6, 6), 3)(image).permute(1, 2, 0).numpy().astype(np.float64)
    assert np.abs(out - expected).max() <= 1
    assert (out[0] == 255).all()  # transparent -> white, whatever colour the hidden pixels had
    grey = eval_transform((6, 6), 1)(image)[0].numpy()
    assert np.abs(grey - _luma(np.rint(expected).astype(np.uint8))).max() <= 1


def test_grayscale_to_rgb_repeats_the_channel_and_statistics():
    gray = Image.fromarray(np.arange(64, dtype=np.uint8).reshape(8, 8))
    x = preprocess(gray, (8, 8), 3, mean=(0.2,), std=(0.4,))
    expected = (torch.arange(64, dtype=torch.float32).reshape(8, 8) / 255 - 0.2) / 0.4
    for c in range(3):
        torch.testing.assert_close(x[c], expected)


def test_normalize_matches_torchvision():
    images = torch.randint(0, 256, (4, 3, 5, 5), dtype=torch.uint8)
    mean, std = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)
    reference = v2.Normalize(mean, std)(v2.ToDtype(torch.float32, scale=True)(images))
    torch.testing.assert_close(normalize(images, mean, std), reference)
    gray = images[:, :1]
    reference_gray = v2.Normalize([sum(mean) / 3], [sum(std) / 3])(gray.float() / 255)
    torch.testing.assert_close(normalize(gray, mean, std), reference_gray)


def test_eval_transform_resizes_the_shorter_side_and_crops_the_centre():
    wide = Image.fromarray(np.random.default_rng(2).integers(0, 256, (20, 40, 3), dtype=np.uint8))
    out = eval_transform((10, 10), 3)(wide)
    reference = v2.PILToTensor()(wide.resize((20, 10), Image.Resampling.BILINEAR).crop((5, 0, 15, 10)))
    assert torch.equal(out, reference)
    assert center_crop_share((20, 40), (10, 10)) == 0.5  # the 10x10 crop of the 10x20 resized image


@pytest.mark.parametrize(
    ("image", "model", "share"),
    [((20, 4000), (224, 224), 20 / 4000), ((4000, 20), (224, 224), 20 / 4000), ((30, 30), (224, 224), 1.0)]
    + [((100, 100), (224, 448), 0.5), ((50, 100), (224, 448), 1.0), ((40, 100), (224, 448), 0.8)],
)
def test_center_crop_share_is_the_area_the_crop_keeps(image, model, share):
    """Against the crop measured in the image's own pixels: the model's box scaled by the cover factor."""
    assert center_crop_share(image, model) == pytest.approx(share)
    (h, w), (H, W) = image, model
    factor = max(H / h, W / w)
    assert center_crop_share(image, model) == pytest.approx((H / factor) * (W / factor) / (h * w))


def test_samples_can_carry_the_size_of_the_image_as_read(tmp_path):
    paths = [tmp_path / "wide.png", tmp_path / "tall.png"]
    Image.new("RGB", (40, 8)).save(paths[0])
    Image.new("RGB", (6, 30)).save(paths[1])
    sized = TransformedImages(ImageFiles(paths, [0, 1]), eval_transform((8, 8), 3), sizes=True)
    batch = collate([sized[(0, 0)], sized[(1, 0)]])
    assert batch.images.shape == (2, 3, 8, 8) and batch.sizes.tolist() == [[8, 40], [30, 6]]
    plain = TransformedImages(ImageFiles(paths, [0, 1]), eval_transform((8, 8), 3))
    assert collate([plain[(0, 0)]]).sizes is None


def test_transform_arguments_are_checked():
    with pytest.raises(ValueError, match="1 or 3 channels"):
        eval_transform((8, 8), 2)
    with pytest.raises(ValueError, match="min_scale"):
        train_transform((8, 8), 3, min_scale=0.0)
    with pytest.raises(ValueError, match="hflip"):
        train_transform((8, 8), 3, hflip=2.0)
    with pytest.raises(ValueError, match="RandAugment|randaugment"):
        train_transform((8, 8), 3, randaugment=31)


def test_unreadable_files_are_reported_not_raised(tmp_path):
    good = tmp_path / "good.png"
    Image.new("RGB", (8, 8), (1, 2, 3)).save(good)
    truncated = tmp_path / "truncated.png"
    truncated.write_bytes(good.read_bytes()[:40])
    text = tmp_path / "text.jpg"
    text.write_text("not an image")
    images = TransformedImages(ImageFiles([good, truncated, text], [0, 1, 1]), eval_transform((8, 8), 3))
    samples = [images[(i, 0)] for i in range(3)]
    assert isinstance(samples[1], Unreadable) and samples[1].name == str(truncated)
    assert isinstance(samples[2], Unreadable) and samples[2].name == str(text)
    # The reason is the decoder's message, not a repetition of the path.
    assert "truncated" in samples[1].error and not samples[1].error.startswith("cannot read image")
    assert "cannot identify image file" in samples[2].error
    batch = collate(samples)
    assert batch.images.shape == (1, 3, 8, 8) and batch.labels.tolist() == [0]
    assert [s.name for s in batch.skipped] == [str(truncated), str(text)]
    empty = collate(samples[1:])
    assert empty.images.shape[0] == 0 and empty.labels.shape == (0,)


def test_unreadable_summary_lists_the_first_few_with_reasons_then_a_count():
    skipped = [Unreadable(f"img{i}.png", f"reason {i}") for i in (3, 1, 0, 2, 6, 5, 4)]
    text = summarize_unreadable([*skipped, Unreadable("img1.png", "met again")], limit=3)
    assert text.splitlines() == [
        "skipped 7 unreadable images:",
        "  img0.png: reason 0",
        "  img1.png: reason 1",
        "  img2.png: reason 2",
        "  and 4 more",
    ]
    assert summarize_unreadable(skipped[:1]).splitlines() == ["skipped 1 unreadable image:", "  img3.png: reason 3"]
    assert summarize_unreadable([]) == ""
    assert str(skipped[0]) == "img3.png: reason 3"


def test_eval_transform_covers_a_non_square_model_and_keeps_square_ones():
    """The image resized to cover (H, W), then its centre: no black bars for a 4:3 photo on a 2:3 model; a square
    model's shorter side resized to its side, as torchvision's Resize(S) and CenterCrop(S) do."""
    from vitkit.data import eval_transform

    rng = np.random.default_rng(0)
    photo = Image.fromarray(rng.integers(1, 256, (480, 640, 3), dtype=np.uint8))  # no zero pixel
    out = eval_transform((224, 320), 3)(photo)
    assert out.shape == (3, 224, 320) and out.min() > 0
    expected = v2.functional.center_crop(v2.functional.resize(photo, [240, 320], antialias=True), [224, 320])
    assert torch.equal(out, v2.functional.pil_to_tensor(expected))
    tall = Image.fromarray(rng.integers(1, 256, (300, 100, 3), dtype=np.uint8))
    assert eval_transform((224, 320), 3)(tall).min() > 0
    square = v2.Compose([v2.Resize(224, antialias=True), v2.CenterCrop(224), v2.PILToTensor()])
    assert torch.equal(eval_transform((224, 224), 3)(photo), square(photo))

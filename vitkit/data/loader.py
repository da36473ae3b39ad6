"""Batches for training and evaluation: a seeded, shardable sample order and a DataLoader that skips bad files.

All randomness of the data lives in `EpochSampler`: for epoch e it draws a permutation and one augmentation seed
per sample from a generator seeded with (seed + e), so an epoch's batches are the same whatever the number of
loader workers, and a run resumed at any batch sees the data the uninterrupted run saw.

Letters: B batch, C channels, H, W image size.
"""

from __future__ import annotations

import signal
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass

import torch
from PIL import Image
from torch.utils.data import DataLoader, Dataset, Sampler

from vitkit.data.sources import ImageSource


class EpochSampler(Sampler[tuple[int, ...]]):
    """This process's share of an epoch's samples, as (index, augmentation seed) pairs.

    As `torch.utils.data.DistributedSampler`: with `shuffle` the order is a permutation seeded by seed + epoch,
    padded by repeating its start to a multiple of `num_replicas` (only with `pad`), and process `rank` takes
    every `num_replicas`-th sample from position `rank`. `set_epoch(epoch, start)` selects the epoch and skips
    the first `start` samples of this process's share.

    Given the `batch_size` of the loader, samples come as (index, seed, batch seed) triples: the batch seed is
    the same for every sample of a step's batches in all processes (what one draw per batch, such as a training
    size shared by the batch, is drawn from). Given also `groups` (a group id per sample, e.g. the images'
    orientation), the permutation is rearranged so that each step's batches hold one group where it can, as
    torchvision's `GroupedBatchSampler` does: images of one shape pad less when batched.
    """

    def __init__(
        self,
        size: int,
        num_replicas: int = 1,
        rank: int = 0,
        shuffle: bool = True,
        seed: int = 0,
        pad: bool = True,
        batch_size: int | None = None,
        groups: Sequence[int] | None = None,
    ) -> None:
        if size <= 0:
            raise ValueError(f"cannot sample from an empty dataset (size {size})")
        if not 0 <= rank < num_replicas:
            raise ValueError(f"rank {rank} is outside 0..{num_replicas - 1}")
        if batch_size is not None and batch_size <= 0:
            raise ValueError(f"batch_size must be positive, got {batch_size}")
        if groups is not None and (batch_size is None or len(groups) != size):
            raise ValueError(f"groups needs a batch_size and one group per sample ({size}), got {len(groups)}")
        self.size, self.num_replicas, self.rank = size, num_replicas, rank
        self.shuffle, self.seed, self.pad = shuffle, seed, pad
        self.batch_size, self.groups = batch_size, None if groups is None else list(groups)
        self.epoch, self.start = 0, 0

    def set_epoch(self, epoch: int, start: int = 0) -> None:
        self.epoch, self.start = epoch, start

    def _share(self) -> list[tuple[int, ...]]:
        generator = torch.Generator().manual_seed(self.seed + self.epoch)
        order = torch.randperm(self.size, generator=generator) if self.shuffle else torch.arange(self.size)
        seeds = torch.randint(0, 2**62, (self.size,), generator=generator)
        if self.groups is not None:
            order = grouped_order(order, self.groups, self.batch_size * self.num_replicas)
        if self.pad:
            total = -(-self.size // self.num_replicas) * self.num_replicas
            order = order.repeat(-(-total // self.size))[:total]  # repeats the start, as often as needed
        mine = order[self.rank :: self.num_replicas]
        if self.batch_size is None:
            return list(zip(mine.tolist(), seeds[mine].tolist(), strict=True))
        steps = -(-len(mine) // self.batch_size)
        step_seeds = torch.randint(0, 2**62, (steps,), generator=generator)  # one per step, shared by processes
        shared = step_seeds.repeat_interleave(self.batch_size)[: len(mine)]
        return list(zip(mine.tolist(), seeds[mine].tolist(), shared.tolist(), strict=True))

    def __iter__(self) -> Iterator[tuple[int, ...]]:
        return iter(self._share()[self.start :])

    def __len__(self) -> int:
        share = -(-self.size // self.num_replicas) if self.pad else len(range(self.rank, self.size, self.num_replicas))
        return max(share - self.start, 0)


def grouped_order(order: torch.Tensor, groups: Sequence[int], chunk: int) -> torch.Tensor:
    """`order` rearranged into runs of `chunk` samples of one group, each run placed where its last sample was in
    `order`; the samples of groups left short of a run follow in their order (torchvision's
    `GroupedBatchSampler`, on positions instead of batches)."""
    runs, pending = [], {}
    for index in order.tolist():
        run = pending.setdefault(groups[index], [])
        run.append(index)
        if len(run) == chunk:
            runs += pending.pop(groups[index])
    position = {index: i for i, index in enumerate(order.tolist())}
    rest = sorted((i for run in pending.values() for i in run), key=position.__getitem__)
    return torch.tensor(runs + rest, dtype=order.dtype)


@dataclass(frozen=True)
class Unreadable:
    """Stands in for a sample whose image could not be decoded."""

    name: str  # the file (or array entry) that failed
    error: str  # why (the decoder's message, or the mode or value range vitkit does not convert)

    def __str__(self) -> str:
        return f"{self.name}: {self.error}"


def summarize_unreadable(skipped: Iterable[Unreadable], limit: int = 5) -> str:
    """Lines for people about skipped images: a count, the first `limit` by name with the reason, then how many more.

    Each file counts once however often it was met (every epoch, every process); "" when there is none. Example::

        skipped 12 unreadable images:
          data/cat/3.png: image file is truncated (8 bytes not processed)
          ...
          and 7 more
    """
    reasons: dict[str, str] = {}
    for item in skipped:
        reasons.setdefault(item.name, item.error)
    if not reasons:
        return ""
    names = sorted(reasons)
    lines = [f"skipped {len(names)} unreadable image{'s' if len(names) != 1 else ''}:"]
    lines += [f"  {name}: {reasons[name]}" for name in names[:limit]]
    if len(names) > limit:
        lines.append(f"  and {len(names) - limit} more")
    return "\n".join(lines)


class TransformedImages(Dataset):
    """A source's samples as (uint8 image (C, H, W), label), transformed with a per-sample seed; with `sizes`, as
    (image, label, (height, width) of the image as read, before the transform), which `collate` gathers in
    `Batch.sizes`.

    Indexed by the (index, seed) pairs of `EpochSampler`; the transform runs under `torch.manual_seed(seed)` in a
    forked RNG, so augmentation does not depend on which worker runs it and leaves the global RNG untouched.
    An image that cannot be decoded gives an `Unreadable` instead of raising.
    """

    def __init__(
        self, source: ImageSource, transform: Callable[[Image.Image], torch.Tensor], sizes: bool = False
    ) -> None:
        self.source = source
        self.transform = transform
        self.sizes = sizes

    def __len__(self) -> int:
        return len(self.source)

    def __getitem__(self, key: tuple[int, int]) -> tuple[torch.Tensor, int] | Sized | Unreadable:
        index, seed = key
        try:
            image = self.source.load(index)
        except OSError as err:  # UnreadableImageError keeps the reason apart from the path
            return Unreadable(self.source.describe(index), getattr(err, "reason", None) or str(err))
        with torch.random.fork_rng(devices=[]):
            torch.default_generator.manual_seed(seed)  # the CPU generator only: torch.manual_seed costs far more
            sample = self.transform(image), self.source.labels[index]
        return (*sample, (image.height, image.width)) if self.sizes else sample


Sized = tuple[torch.Tensor, int, tuple[int, int]]  # a sample of `TransformedImages(sizes=True)`


@dataclass
class Batch:
    images: torch.Tensor  # (B, C, H, W) uint8; B may be 0 when every image failed
    labels: torch.Tensor  # (B,) int64
    skipped: list[Unreadable]  # samples of this batch that could not be read
    sizes: torch.Tensor | None = None  # (B, 2) int64: each image's (height, width) as read, before the transform,
    # from `TransformedImages(sizes=True)`; None otherwise

    def pin_memory(self) -> Batch:
        """Called by DataLoader(pin_memory=True): page-locked tensors copy to the GPU asynchronously."""
        return Batch(self.images.pin_memory(), self.labels.pin_memory(), self.skipped, self.sizes)


def collate(samples: list[tuple[torch.Tensor, int] | Sized | Unreadable]) -> Batch:
    """Stack the readable samples (and their sizes, when they carry them); report the unreadable ones in
    `Batch.skipped`."""
    good = [s for s in samples if not isinstance(s, Unreadable)]
    skipped = [s for s in samples if isinstance(s, Unreadable)]
    if not good:
        return Batch(torch.empty(0, dtype=torch.uint8), torch.empty(0, dtype=torch.long), skipped)
    images = torch.stack([sample[0] for sample in good])  # (B, C, H, W)
    sizes = torch.tensor([sample[2] for sample in good]) if len(good[0]) == 3 else None  # (B, 2)
    return Batch(images, torch.tensor([sample[1] for sample in good]), skipped, sizes)


def ignore_stop_signals(worker_id: int) -> None:
    """A loader worker's `worker_init_fn`: Ctrl-C (SIGINT) and SIGTERM are left to the main process, which stops at
    the end of a step and saves. A job stopped as a whole (`timeout`, Slurm, systemd signal every process of it)
    would otherwise kill the workers first, and the main process with them, before it could save."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)


def make_loader(
    images: TransformedImages, sampler: EpochSampler, batch_size: int, workers: int = 0, pin_memory: bool = False
) -> DataLoader:
    """A DataLoader of `Batch`es over `images` in `sampler`'s order (call `sampler.set_epoch` before iterating)."""
    if batch_size <= 0:
        raise ValueError(f"batch_size must be positive, got {batch_size}")
    if workers < 0:
        raise ValueError(f"workers must be >= 0, got {workers}")
    return DataLoader(
        images,
        batch_size=batch_size,
        sampler=sampler,
        num_workers=workers,
        collate_fn=collate,
        pin_memory=pin_memory,
        worker_init_fn=ignore_stop_signals if workers > 0 else None,
        generator=loader_generator(sampler),
    )


def loader_generator(sampler: EpochSampler) -> torch.Generator:
    """The DataLoader's own generator, seeded by the run: each `iter(loader)` draws its workers' base seed from
    it instead of from torch's global generator, which the model's dropout and a detector's denoising queries
    draw from. Otherwise a run resumed inside an epoch, whose new iterator draws once more, would continue on
    other random numbers than the run it resumes (its images are seeded per sample by the sampler either way)."""
    return torch.Generator().manual_seed(sampler.seed)

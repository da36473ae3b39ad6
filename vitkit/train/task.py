"""What the training loop asks of a task: its data and loaders, the loss of a batch, the evaluation, the metric that
picks the best model and what a saved model carries beside its weights (`saved_info`).

`ClassificationTask` trains a classifier with cross-entropy (label smoothing, MixUp / CutMix) and validates by
accuracy; `DetectionTask` trains DETR with its set criterion (Hungarian matching, `vitkit.detection`) and validates
by COCO mAP. `create_task(config, env)` picks the one the resolved config's `task` names.
"""

from __future__ import annotations

import dataclasses
import logging
import math
from collections.abc import Iterable
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, Dataset
from torchvision.ops import box_convert
from torchvision.transforms import v2

from vitkit.analysis.precision import outputs_sum
from vitkit.data import (
    DetectionAugment,
    EpochSampler,
    TransformedImages,
    Unreadable,
    detection_sampler,
    eval_transform,
    ignore_stop_signals,
    jittered_sides,
    load_data,
    load_detection,
    loader_generator,
    make_loader,
    normalize,
    train_transform,
)
from vitkit.data.tiles import TiledDetection
from vitkit.detection import (
    FOCAL_PRIOR,
    BoxClassification,
    Postprocessing,
    average_num_boxes,
    collate_detection,
    criterion_for,
    make_denoising,
)
from vitkit.infer import autocast, evaluate, evaluate_detector
from vitkit.infer.evaluate import evaluate_detector_tiled
from vitkit.layers import to_2tuple
from vitkit.models.interface import denoising_settings, has_no_object_logit, predicts_masks, require_model
from vitkit.models.registry import model_entry, replace_config
from vitkit.train.config import TrainConfig
from vitkit.train.distributed import DistEnv
from vitkit.train.recipe import CLASSIFICATION, DETECTION
from vitkit.train.sharding import Lockstep, is_sharded, most_batches
from vitkit.util import counted
from vitkit.weights import ModelInfo, saved_config

log = logging.getLogger("vitkit.train")


def forward_loss(
    model: nn.Module, images: torch.Tensor, targets: torch.Tensor, criterion: nn.Module, precision: str
) -> torch.Tensor:
    """The training loss of one classification batch: the forward pass under `precision`, the criterion in float32."""
    with autocast(images.device, precision):
        logits = model(images)  # (B, K)
    return criterion(logits.float(), targets)


def _batch_mixer(config: TrainConfig, num_classes: int) -> v2.Transform | None:
    mixers = []
    if config.mixup > 0:
        mixers.append(v2.MixUp(alpha=config.mixup, num_classes=num_classes))
    if config.cutmix > 0:
        mixers.append(v2.CutMix(alpha=config.cutmix, num_classes=num_classes))
    if not mixers:
        return None
    return mixers[0] if len(mixers) == 1 else v2.RandomChoice(mixers)


def _zero_loss(outputs: Any) -> torch.Tensor:
    """0 times the sum of a model's outputs: a loss that reaches every parameter the outputs used, so that a step
    without readable images keeps DDP's gradient exchange in step."""
    return outputs_sum(outputs) * 0.0


class Task:
    """The parts of a training run that depend on the task; the loop (`vitkit.train.loop`) drives them.

    After `__init__` (which reads the data and sets `info`, the data's classes and normalisation, and
    `num_classes`), the loop builds the model and calls `prepare(model)`; then per epoch `set_epoch`, `train_loss` per
    batch, and `evaluate` at its end.
    """

    name: str
    best_metric: str  # the metrics key whose largest value selects best/
    loss_parts: tuple[str, ...] = ()  # train-loss components logged beside train_loss, each averaged per image
    train_loader: DataLoader
    val_loader: DataLoader
    train_sampler: EpochSampler

    def __init__(self, config: TrainConfig, env: DistEnv) -> None:
        self.config, self.env = config, env
        self.info = ModelInfo()
        self.num_classes = 0

    def _samplers(self, train: Dataset, val: Dataset) -> EpochSampler:
        env = self.env
        self.train_sampler = EpochSampler(len(train), env.world_size, env.rank, seed=self.config.seed)
        return EpochSampler(len(val), env.world_size, env.rank, shuffle=False, pad=False)

    def prepare(self, model: nn.Module) -> nn.Module:
        """Build the loaders and the criterion for `model`; returns the module that training runs (and DDP wraps):
        the model itself, or the model with training-only parts around it."""
        raise NotImplementedError

    def state_dict(self) -> dict[str, Any]:
        """The task's own trained state (training-only parts), for the checkpoint."""
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore `state_dict`."""

    def set_epoch(self, epoch: int, start: int) -> None:
        """Select epoch `epoch`'s training samples, skipping this process's first `start`."""
        self.train_sampler.set_epoch(epoch, start=start)

    def augmentation(self) -> str:
        """How training images are augmented, for the run's summary ("" when they are not)."""
        return ""

    def splits(self) -> str:
        """The training and validation samples, for the run's summary."""
        return f"{len(self.train_loader.dataset)} train / {len(self.val_loader.dataset)} val images"

    def train_loss(self, model: nn.Module, batch: Any) -> tuple[torch.Tensor, dict[str, torch.Tensor], int]:
        """(loss to minimise, {"train_loss": loss, and each of `loss_parts`}, images it averages over)."""
        raise NotImplementedError

    def evaluate(self, model: nn.Module) -> tuple[dict[str, float], tuple[Unreadable, ...]]:
        """(validation metrics, unreadable samples met) of `model` on the held-out loader."""
        raise NotImplementedError

    def describe(self, metrics: dict[str, Any]) -> str:
        """The validation part of an epoch's log line."""
        raise NotImplementedError

    def val_batches(self, model: nn.Module) -> Iterable[Any]:
        """The validation loader; for a model sharded over several processes, one that keeps them in step: each
        runs as many forward passes as the process with the most batches (`vitkit.train.sharding.Lockstep`)."""
        env = self.env
        if env.world_size == 1 or not is_sharded(model):
            return self.val_loader
        share = math.ceil(len(self.val_loader.dataset) / env.world_size)  # rank 0's, the largest
        passes = most_batches(share, self.config.batch_size)
        first = require_model(model, "sharded evaluation").shard_units()[0]
        return Lockstep(self.val_loader, passes, first, lambda: self.idle_forward(model))

    def idle_forward(self, model: nn.Module) -> None:
        """An evaluation forward pass of `model` on one blank image, which keeps the processes in step."""
        raise NotImplementedError

    def images_forward(self, model: nn.Module, images: torch.Tensor) -> Any:
        """The training module's forward on `images` (B, C, H, W) without targets, with whatever else the task
        passes it: a step without readable images, and the step `precision="auto"` times (`Run`)."""
        raise NotImplementedError

    def probe_sizes(self, count: int) -> list[tuple[int, int]]:
        """`count` input sizes (H, W) as training gives them to the model, for the step `precision="auto"` times:
        the model's input size throughout (a detector trained at several sizes: other sizes)."""
        return [tuple(self.image_shape[1:])] * count

    def saved_info(self) -> ModelInfo:
        """What a saved model of the run carries beside its weights (`vitkit.save_pretrained` writes it into its
        config.json): the data's classes, normalisation and description."""
        return self.info


class ClassificationTask(Task):
    """Cross-entropy (label smoothing, MixUp / CutMix) on augmented images; validation loss and top-1 accuracy."""

    name = CLASSIFICATION
    best_metric = "val_acc"

    def __init__(self, config: TrainConfig, env: DistEnv) -> None:
        super().__init__(config, env)
        self.train_source, self.val_source, data = load_data(config.data, config.val_fraction, config.seed)
        self.info = ModelInfo(
            data.classes,
            data.mean,
            data.std,
            data=data.source,
            val_fraction=data.val_fraction,
            split_seed=data.split_seed,
        )
        self.num_classes = len(self.info.classes)

    def prepare(self, model: nn.Module) -> nn.Module:
        config, env = self.config, self.env
        img_size, channels = to_2tuple(model.config.img_size), model.config.in_chans
        self.image_shape = (channels, *img_size)  # (C, H, W) of one input
        augment = train_transform(img_size, channels, config.min_scale, config.hflip, config.randaugment)
        val_sampler = self._samplers(self.train_source, self.val_source)
        pin = env.device.type == "cuda"
        self.train_loader = make_loader(
            TransformedImages(self.train_source, augment), self.train_sampler, config.batch_size, config.workers, pin
        )
        self.val_loader = make_loader(
            TransformedImages(self.val_source, eval_transform(img_size, channels)),
            val_sampler,
            config.batch_size,
            config.workers,
            pin,
        )
        self.criterion = nn.CrossEntropyLoss(label_smoothing=config.label_smoothing)
        self.mixer = _batch_mixer(config, self.num_classes)
        return model

    def train_loss(self, model: nn.Module, batch: Any) -> tuple[torch.Tensor, dict[str, torch.Tensor], int]:
        device = self.env.device
        targets = batch.labels.to(device, non_blocking=True)
        if len(targets) > 0:
            images = batch.images.to(device, non_blocking=True)
            images = normalize(images, self.info.mean, self.info.std)  # (B, C, H, W) float
            if self.mixer is not None:
                images, targets = self.mixer(images, targets)
            loss = forward_loss(model, images, targets, self.criterion, self.config.precision)
        else:  # every image was unreadable: a zero loss through the model keeps the processes in step
            loss = _zero_loss(self.images_forward(model, torch.zeros(1, *self.image_shape, device=device)))
        return loss, {"train_loss": loss.detach()}, len(targets)

    def evaluate(self, model: nn.Module) -> tuple[dict[str, float], tuple[Unreadable, ...]]:
        result = evaluate(model, self.val_batches(model), self.info, self.env.world_size > 1, self.config.precision)
        return {"val_loss": result.loss, "val_acc": result.top1}, result.skipped

    def idle_forward(self, model: nn.Module) -> None:
        model(torch.zeros(1, *self.image_shape, device=self.env.device))

    def images_forward(self, model: nn.Module, images: torch.Tensor) -> Any:
        return model(images)

    def describe(self, metrics: dict[str, Any]) -> str:
        return f"val_loss {metrics['val_loss']:.4f}  val_acc {metrics['val_acc']:.4f}"


def _detector_config(config: TrainConfig) -> Any:
    """The config of the detector the run will build (its image size and channels size the data)."""
    overrides = dict(config.model_args)
    if config.img_size is not None:
        overrides["img_size"] = config.img_size
    if config.model is not None:
        return replace_config(model_entry(config.model).config, **overrides)
    return saved_config(config.init, **overrides)  # a vitkit or Hugging Face directory


def _detection_loader(dataset: Dataset, sampler: EpochSampler, batch_size: int, workers: int, pin: bool) -> DataLoader:
    """`vitkit.data.make_loader` for detection samples: padded batches (`collate_detection`)."""
    return DataLoader(
        dataset, batch_size=batch_size, sampler=sampler, num_workers=workers, collate_fn=collate_detection,
        pin_memory=pin, generator=loader_generator(sampler),
        worker_init_fn=ignore_stop_signals if workers > 0 else None,
    )  # fmt: skip


def _pixel_boxes(targets: list[dict[str, torch.Tensor]]) -> list[torch.Tensor]:
    """Each target's boxes as (x0, y0, x1, y1) in pixels of the image given to the model (its `size`)."""
    boxes = []
    for t in targets:
        height, width = t["size"].tolist()
        scale = t["boxes"].new_tensor([width, height, width, height])
        boxes.append(box_convert(t["boxes"], "cxcywh", "xyxy") * scale)  # (n, 4)
    return boxes


class DetectionTask(Task):
    """DETR's set criterion (Hungarian matching, classification, L1 and GIoU box losses on every decoder layer) on
    padded batches of detection samples; validation by COCO mAP (`vitkit.detection.CocoEvaluator`).

    The classification loss is the config's `detection_loss`: "ce", DETR's softmax cross-entropy with "no object"
    weighted 0.1, or "focal", Deformable DETR's sigmoid focal loss (arXiv:2010.04159), matched with class cost 2
    and weighted 2, with a fresh model's class biases set to the prior probability 0.01 as Deformable DETR does.
    "ce" needs a model with a "no object" logit (`vitkit.models.interface.has_no_object_logit`); the config's
    resolution refuses it for one without.
    A detector that declares denoising settings (`vitkit.models.interface.denoising_settings`) gets each batch's
    denoising queries (`vitkit.detection.make_denoising`) and their losses (`loss_dn`: the last layer's, weighted).
    With `box_cls_loss` > 0 the backbone's classification of the ground-truth boxes
    (`vitkit.detection.BoxClassification`) is added with that weight (`loss_box_cls`); its classifier is part of the
    checkpoint, not of the saved model.
    """

    name = DETECTION
    best_metric = "ap"

    def __init__(self, config: TrainConfig, env: DistEnv) -> None:
        super().__init__(config, env)
        model_config = _detector_config(config)
        side = config.img_size or min(to_2tuple(model_config.img_size))
        augment = DetectionAugment(config.hflip or 0.0, config.scale_jitter or 0.0, config.crop or 0.0)
        channels, tile = model_config.in_chans, config.tile_side
        whole = {} if tile is None else {"max_size": None}  # a tile is resized to the side, however long
        self.train_set, self.val_set, data = load_detection(
            config.data, seed=config.seed, channels=channels, img_size=side, augment=augment, **whole
        )
        if tile is not None:  # training tiles drawn from the images; validation on whole images, in tiles
            self.train_set = TiledDetection(self.train_set, tile)
            _, self.val_set, _ = load_detection(
                config.data, channels=channels, val_only=True, short_side=None, max_size=None
            )
        self.info = ModelInfo(
            data.classes, data.mean, data.std, category_ids=data.category_ids, data=data.source, tile=tile
        )
        self.num_classes = len(self.info.classes)
        self.loss_parts = ("loss_ce", "loss_bbox", "loss_giou") + (("loss_box_cls",) if config.box_cls_loss else ())
        self.masks = False  # the model predicts masks, and the data has them (`prepare`)
        for split in (self.train_set, self.val_set):
            report = getattr(split, "report", None)  # what a COCO file's loading skipped
            if report is not None and (report.skipped or report.clipped or report.crowd_as_objects) and env.is_main:
                log.warning(str(report))

    def _samplers(self, train: Dataset, val: Dataset) -> EpochSampler:
        """As a classifier's, with batches of one orientation (they pad less; `vitkit.data.detection_sampler`) and a
        seed per training batch (the batch's size under multi-scale training)."""
        env, batch = self.env, self.config.batch_size
        self.train_sampler = detection_sampler(train, batch, env.world_size, env.rank, True, self.config.seed)
        return detection_sampler(val, batch, env.world_size, env.rank)

    def prepare(self, model: nn.Module) -> nn.Module:
        config, env = self.config, self.env
        self.masks = predicts_masks(model)
        if self.masks and not self.train_set.with_masks:
            what = f"the model in {config.init}" if config.init else repr(config.model)
            raise ValueError(
                f"{what} has a mask head (masks=True), but the training annotations of {config.data} hold no masks "
                "(every annotation needs a segmentation): add them, or train without the head (--model-arg "
                "masks=false)"
            )
        self.image_shape = (model.config.in_chans, *to_2tuple(model.config.img_size))
        val_sampler = self._samplers(self.train_set, self.val_set)
        pin = env.device.type == "cuda"
        batch, workers = config.batch_size, config.workers
        self.train_loader = _detection_loader(self.train_set, self.train_sampler, batch, workers, pin)
        self.val_loader = _detection_loader(self.val_set, val_sampler, batch, workers, pin)
        self.no_object_logit = has_no_object_logit(model)
        self.criterion = criterion_for(
            config.detection_loss, self.num_classes, model.config.aux_loss, self.no_object_logit
        ).to(env.device)
        if config.detection_loss == "focal" and config.init is None:  # a fresh model: every class starts unlikely
            model.reset_classifier(model.config.num_classes, prior=FOCAL_PRIOR)
        self.boxes = BoxClassification(model, self.num_classes).to(env.device) if config.box_cls_loss > 0 else None
        self.denoising = denoising_settings(model)
        self.threshold: float | None = None  # the score threshold of the last evaluation's best F1
        if self.masks:
            self.loss_parts += ("loss_mask", "loss_dice")
        if self.denoising is not None:
            self.loss_parts += ("loss_dn",)
        return self.boxes if self.boxes is not None else model

    def state_dict(self) -> dict[str, Any]:
        return {"box_head": self.boxes.head.state_dict()} if self.boxes is not None else {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if self.boxes is not None:
            self.boxes.head.load_state_dict(state["box_head"])

    def splits(self) -> str:
        if self.config.tile_side is None:
            return super().splits()
        tiles, images = len(self.train_set), len(self.train_set.data)
        return (
            f"{tiles} train tiles of {self.config.tile_side} px an epoch, from {counted(images, 'image')} / "
            f"{len(self.val_set)} val images (whole, in tiles)"
        )

    def augmentation(self) -> str:
        config, transform = self.config, getattr(self.train_set, "transform", None)
        if transform is None:
            return "random tiles" if config.tile_side is not None else ""
        parts = [f"random tiles of {config.tile_side} px"] if config.tile_side is not None else []
        parts += [f"flip {config.hflip:g}"] if config.hflip else []
        if config.crop:
            parts.append(f"crop {config.crop:g}")
        if config.scale_jitter:
            low, high = jittered_sides(self.train_set.short_side, config.scale_jitter)
            parts.append(f"shorter side {low}-{high} px")
        return ", ".join(parts)

    def probe_sizes(self, count: int) -> list[tuple[int, int]]:
        """A new size each time, as batches of a detector come: spread over the shorter sides training jitters the
        images to, at the input's aspect; without the jitter, the input's size 16 px wider each time (images of
        their own shapes, batched and padded)."""
        height, width = self.image_shape[1:]
        if self.config.scale_jitter and getattr(self.train_set, "transform", None) is not None:
            low, high = jittered_sides(self.train_set.short_side, self.config.scale_jitter)
            sides = [round(low + (high - low) * i / max(count - 1, 1)) for i in range(count)]
            return [(side, round(side * width / height)) if height <= width else (round(side * height / width), side)
                    for side in sides]  # fmt: skip
        return [(height, width + 16 * i) for i in range(count)]

    def set_epoch(self, epoch: int, start: int) -> None:
        super().set_epoch(epoch, start)
        if hasattr(self.train_set, "set_epoch"):  # digits-detect draws fresh training canvases every epoch
            self.train_set.set_epoch(epoch)

    def train_loss(self, model: nn.Module, batch: Any) -> tuple[torch.Tensor, dict[str, torch.Tensor], int]:
        device = self.env.device
        if not batch.targets:  # every image was unreadable
            return self._empty_step(model)
        batch = batch.to(device, non_blocking=True)
        extra, denoised = {}, None
        if self.denoising is not None:  # noised copies of the boxes beside the object queries (DN-DETR, DINO)
            extra["denoising"], denoised = make_denoising(batch.targets, self.denoising, self.num_classes)
        with autocast(device, self.config.precision):
            if self.boxes is not None:
                outputs, box_logits = model(batch.images, batch.pixel_mask, _pixel_boxes(batch.targets), **extra)
            else:
                outputs = model(batch.images, batch.pixel_mask, **extra)  # pred_logits (B, Q, K + 1 | K), pred_boxes
        losses = self.criterion(outputs, batch.targets, denoised)  # float32
        parts = {name: losses[name] for name in ("loss_ce", "loss_bbox", "loss_giou", "loss_mask", "loss_dice")
                 if name in losses}  # fmt: skip
        if self.denoising is not None:  # the last layer's denoising terms, weighted as in the total
            weights = self.criterion.weights.items()
            parts["loss_dn"] = sum(weight * losses[f"{name}_dn"] for name, weight in weights if f"{name}_dn" in losses)
        loss = losses["total"]
        if self.boxes is not None:
            labels = torch.cat([t["labels"] for t in batch.targets])  # (T,)
            box_cls = F.cross_entropy(box_logits.float(), labels) if len(labels) else _zero_loss(box_logits)
            parts["loss_box_cls"] = box_cls
            loss = loss + self.config.box_cls_loss * box_cls
        return loss, {"train_loss": loss.detach(), **{k: v.detach() for k, v in parts.items()}}, len(batch.targets)

    def images_forward(self, model: nn.Module, images: torch.Tensor) -> Any:
        device, extra = images.device, {}
        if self.denoising is not None:  # padding slots only: the same parameters as a step with boxes
            empty = {"labels": torch.zeros(0, dtype=torch.int64, device=device), "boxes": images.new_zeros(0, 4)}
            extra["denoising"] = make_denoising([empty] * len(images), self.denoising, self.num_classes)[0]
        if self.boxes is not None:
            return model(images, None, [torch.zeros(0, 4, device=device)] * len(images), **extra)
        return model(images, **extra)

    def _empty_step(self, model: nn.Module) -> tuple[torch.Tensor, dict[str, torch.Tensor], int]:
        """A zero loss through the training module, and the criterion's exchange of box counts: a step without
        images that keeps the processes in step."""
        device = self.env.device
        outputs = self.images_forward(model, torch.zeros(1, *self.image_shape, device=device))
        average_num_boxes([], device)
        loss = _zero_loss(outputs)
        return loss, {"train_loss": loss.detach(), **{k: loss.detach() for k in self.loss_parts}}, 0

    def evaluate(self, model: nn.Module) -> tuple[dict[str, float], tuple[Unreadable, ...]]:
        distributed, precision = self.env.world_size > 1, self.config.precision
        if self.config.tile_side is not None:  # every process evaluates every image: the same passes in each
            tile, reading = self.config.tile_side, self.postprocessing
            result = evaluate_detector_tiled(
                model, self.val_set, self.info, tile, postprocessing=reading, progress=False, precision=precision
            )
        else:
            batches = self.val_batches(model)
            result = evaluate_detector(model, batches, self.info, self.postprocessing, distributed, precision)
        self.threshold = result.threshold  # saved with the model evaluated (`saved_info`), for predict
        metrics = dict(result.metrics)
        if len(result.classes) <= PER_CLASS_CURVES:  # each class's AP, drawn in curves.png beside the overall
            rows = zip(result.classes, result.per_class, strict=True)
            metrics.update({f"ap/{name}": row["ap"] for name, row in rows})
        return metrics, result.skipped

    def idle_forward(self, model: nn.Module) -> None:
        model.predict(torch.zeros(1, *self.image_shape, device=self.env.device))  # as evaluate_detector runs it

    def describe(self, metrics: dict[str, Any]) -> str:
        shown = ("ap", "ap50", "ap75", "segm_ap", "segm_ap50")  # the masks' where the model predicts them
        return "  ".join(f"{k} {metrics[k]:.4f}" for k in shown if k in metrics)

    def saved_info(self) -> ModelInfo:
        """The data's classes, their category ids, normalisation and description, and how the model's outputs are
        read (`postprocessing`)."""
        return dataclasses.replace(self.info, postprocess=self.postprocessing.to_dict())

    @property
    def postprocessing(self) -> Postprocessing:
        """How validation and the saved model read detections: the config's loss, top-k and NMS (0: off), the
        model's class logits (with or without "no object") and the threshold the last evaluation chose (None
        before)."""
        config = self.config
        top_k, nms_iou = config.detection_top_k or None, config.nms_iou or None
        return Postprocessing(config.detection_loss, top_k, nms_iou, self.no_object_logit, self.threshold)


PER_CLASS_CURVES = 10  # a detector of up to this many classes logs each one's AP ("ap/NAME") every epoch


def create_task(config: TrainConfig, env: DistEnv) -> Task:
    """The task of a resolved config, with its data loaded."""
    return DetectionTask(config, env) if config.task == DETECTION else ClassificationTask(config, env)

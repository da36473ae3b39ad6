"""What detection adds to vitkit: batching images of different sizes, and reading boxes out of DETR's outputs."""

from vitkit.detection.postprocess import pad_images, postprocess

__all__ = ["pad_images", "postprocess"]

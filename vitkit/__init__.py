"""vitkit: vision transformers in PyTorch.

One fast attention whose weights can always be read out, ViT / DeiT (and more families) in one registry
with timm-compatible parameter names, published weights by name (`create_model(name, pretrained=True)`,
`from_pretrained("hf-hub:ORG/REPO")`), and model directories saved without pickle.
"""

import importlib.metadata as _metadata

from vitkit.analysis.profile import profile
from vitkit.layers.attention import capture_attention
from vitkit.models.registry import list_models, list_pretrained
from vitkit.perf.optimize import optimize
from vitkit.weights.convert import export_weights, from_pretrained, load_weights
from vitkit.weights.io import save_pretrained
from vitkit.weights.pretrained import create_model

try:
    __version__ = _metadata.version("vitkit")
except _metadata.PackageNotFoundError:  # running from a source tree that was not installed
    __version__ = "0.0.0"

__all__ = [
    "__version__",
    "capture_attention",
    "create_model",
    "export_weights",
    "from_pretrained",
    "list_models",
    "list_pretrained",
    "load_weights",
    "optimize",
    "profile",
    "save_pretrained",
]

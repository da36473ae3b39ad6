"""The attention explorer: one self-contained HTML file (no server, no network, no external script or font) that
shows where any token of a vision transformer looks, layer by layer and head by head, from the data of
`vitkit.infer.explore.explorer_data`.

The page: the image as the model sees it with the selected token's attention over it (click or hover a patch, or pick
the class token or a register; arrow keys move the patch while the image has focus); the layer (Left / Right keys) and
the head or the mean of heads (Up / Down keys); attention rollout (R); small multiples of every layer for the same
token; the prediction; the model's costs and the shape flow of one block. One colour scale per view, with its bar;
titles name the model, the layer, the head and the token. A detector's page draws each object's sampling points as
`vitkit attention`'s figure does: in its level colours (`vitkit.viz.detection.POINT_COLOURS`, held in the page's
data), over the image in grey (a toggle). The first view is drawn by the time the page has loaded (the page inflates
its data itself, in one call), so a screenshot taken at load shows it. `window.vitkitExplorer` exposes the state and
the values drawn, for tests and for the curious; its `ready` resolves once the first view is drawn.
"""

from __future__ import annotations

import json
from importlib import resources
from typing import Any

TEMPLATE = "explorer.html"  # beside this file: the page, with __DATA__ where the data goes


def explorer_page(data: dict[str, Any]) -> str:
    """The explorer's HTML, with `data` (`vitkit.infer.explore.explorer_data`) embedded as JSON."""
    payload = json.dumps(data, separators=(",", ":")).replace("</", "<\\/")  # never closes the script element
    page = resources.files("vitkit.viz").joinpath(TEMPLATE).read_text(encoding="utf-8")
    return page.replace("__DATA__", payload)

"""encoding.nn: synchronized BatchNorm, the Encoding layer, small generic blocks and the losses (pure PyTorch).

The segmentation heads live with their models (``encoding.models.<arch>``); their PyTorch-Encoding import path
``encoding.nn.FCNHead`` (``PSPHead``, ``ASPP``, ``EncModule``, ``JPU``, ...) keeps working.
"""
from .syncbn import *  # noqa: F401,F403
from .loss import *  # noqa: F401,F403
from .encoding import *  # noqa: F401,F403
from .blocks import *  # noqa: F401,F403
from .compat import *  # noqa: F401,F403
from .recompute import *  # noqa: F401,F403
from . import syncbn, loss, encoding, blocks, compat, recompute

__all__ = (syncbn.__all__ + loss.__all__ + encoding.__all__ + blocks.__all__ + compat.__all__
           + recompute.__all__ + ["DistSyncBatchNorm"])  # the last one from encoding.compat

#: Heads and blocks PyTorch-Encoding exported from ``encoding.nn``, now in ``encoding.models``: name -> module.
_MOVED_TO_MODELS = {
    "FCNHead": "fcn", "PyramidPooling": "psp", "PSPHead": "psp", "ASPP": "deeplab", "DeepLabV3Head": "deeplab",
    "EncModule": "encnet", "EncHead": "encnet", "PAM": "danet", "CAM": "danet", "DANetHead": "danet",
    "FPNHead": "fpn", "JPU": "jpu",
}


def __getattr__(name: str):
    """Resolve the PyTorch-Encoding names of the heads (``encoding.models`` imports this package) and of
    :mod:`encoding.compat` lazily."""
    if name in _MOVED_TO_MODELS:
        import importlib

        return getattr(importlib.import_module(f"encoding.models.{_MOVED_TO_MODELS[name]}"), name)
    from .. import compat

    return compat.export(__name__, name)

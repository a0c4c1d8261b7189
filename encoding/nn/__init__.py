"""encoding.nn: synchronized BatchNorm, the Encoding layer, segmentation heads and losses (pure PyTorch)."""
from .syncbn import *  # noqa: F401,F403
from .loss import *  # noqa: F401,F403
from .encoding import *  # noqa: F401,F403
from .customize import *  # noqa: F401,F403
from . import syncbn, loss, encoding, customize

__all__ = syncbn.__all__ + loss.__all__ + encoding.__all__ + customize.__all__

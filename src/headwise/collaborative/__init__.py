"""Collaborative heads (Cordonnier, Loukas, Jaggi 2020): heads share one query and one key projection.

``compress(model, dk=192, calibration=texts, tokenizer=tok)`` converts a pretrained model in place;
``CollaborativeAttention`` is the layer for new models. Math and design: docs/collaborative.md.

The names load on first use (``headwise.lazy``): ``.config`` and ``.declaration`` import without torch.
"""

from typing import TYPE_CHECKING

from ..lazy import attach as _lazy

if TYPE_CHECKING:
    from .compression import Compression, SiteCompression, compress, tradeoff
    from .calibration import input_moments
    from .config import CollaborativeConfig
    from .decompose import Decomposition, Factors, decompose
    from .families import is_collaborative
    from .layer import CollaborativeAttention
    from .method import Collaborative  # registers the package's method

__getattr__, __dir__ = _lazy(__name__, globals())

"""Head mixing as the tools that do not run it see it (``headwise.declaration``)."""

from ..declaration import Declaration
from .config import MixingConfig

MIXING = Declaration(name="mixing", config=MixingConfig, version=2,  # 2: training settings moved to NuclearNormTraining
                     doc="docs/mixing.md", trained_by="headwise mix --mix-epochs",
                     examples=("headwise edit mixing --out minilm-mixers",))

DECLARATIONS = (MIXING,)

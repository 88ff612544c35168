import os

import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
torch.set_num_threads(max(1, min(2, os.cpu_count() or 1)))


@pytest.fixture(scope="session")
def minilm():
    """The packaged all-MiniLM-L6-v2 with the headwise implementation, and its tokenizer."""
    import headwise

    return headwise.load_model()

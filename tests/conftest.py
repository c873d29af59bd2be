import sys
from pathlib import Path

import pytest

# Tests import their shared helpers (causal_conv1d_standin.py, other test modules) by module name.
sys.path.insert(0, str(Path(__file__).parent))


@pytest.fixture
def one_thread():
    """Tiny models: one thread is faster and steadier (two threads wait on each other
    for every small matrix product on a busy machine). Modules opt in with
    pytestmark = pytest.mark.usefixtures("one_thread")."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)

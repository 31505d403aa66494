import pytest
import torch


@pytest.fixture(autouse=True)
def _restore_torch_defaults():
    """Tests may switch the default dtype or seed; put both back afterwards."""
    dtype = torch.get_default_dtype()
    yield
    torch.set_default_dtype(dtype)

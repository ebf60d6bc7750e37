import pytest
import torch
from hypothesis import settings

# The default suite's property tests are bounded and repeatable; the deep profile hunts.
settings.register_profile("default", max_examples=60, derandomize=True)
settings.register_profile("deep", max_examples=3000, derandomize=False)
settings.load_profile("default")


@pytest.fixture(autouse=True)
def _seed() -> None:
    torch.manual_seed(0)

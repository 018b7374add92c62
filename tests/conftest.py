import os
import warnings

import pytest

os.environ.setdefault("PYTHONWARNINGS", "ignore")
warnings.filterwarnings("ignore")


@pytest.fixture(scope="session")
def cora():
    from lightning_gnnpipe.datasets import load_planetoid

    return load_planetoid("Cora")

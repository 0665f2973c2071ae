"""The student edition in a Kaggle-like kernel: tests/test_colab_like.py's tests on Kaggle's runtime.

The kernel (tests/colab_like.py, KAGGLE) is Python 3.12 with Kaggle's versions of torch (2.10.0, the registry's
build), numpy (2.0.2), ipywidgets (8.1.5), jupyter_server … (tests/kaggle_runtime.txt names the sources: Kaggle's
image is built on a Colab image of May 2026, with Kaggle's own pins on top). Every notebook runs as on Kaggle
(KAGGLE_KERNEL_RUN_TYPE set); the footer finds 01 through the answers its kernel ran (not on disk) and 07 in the
copy Kaggle keeps in the kernel's working folder (test_colab_like.FOOTERS says why only those two).

A module of its own so that `./course test`'s workers run it beside the Colab-like one (a file's tests share one
worker); its base environment (about 7 GB, torch with CUDA 12 libraries) lives in build/kaggle-like/.
"""

import colab_like
import pytest
from test_colab_like import (  # noqa: F401  (the fixture and the tests, collected here again)
    colab,
    needs_python,
    test_every_notebook_alone_with_reference_answers,
    test_the_set_up_cell_installs_the_edition_and_changes_no_package_the_kernel_had,
)

pytestmark = [pytest.mark.slow, needs_python(colab_like.KAGGLE)]


@pytest.fixture(scope="module")
def runtime() -> colab_like.Runtime:
    return colab_like.KAGGLE

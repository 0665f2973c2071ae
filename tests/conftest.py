"""Shared paths for the test suite."""

import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
PYTHON = sys.executable


@pytest.fixture(scope="session")
def repo() -> Path:
    return REPO

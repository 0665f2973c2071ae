"""The fast tier's guard (tests/fast_tier.py) holds fixtures of every scope to its promise, not only the test."""

from __future__ import annotations

from pathlib import Path

HERE = Path(__file__).resolve().parent


def test_a_module_fixture_of_a_fast_test_that_starts_a_process_fails_it(pytester):
    pytester.makeconftest(f"import sys\nsys.path.insert(0, {str(HERE)!r})\n"
                          "from fast_tier import pytest_runtest_call, pytest_runtest_setup  # noqa: F401\n")
    pytester.makepyfile(test_inner="""
        import subprocess
        import pytest

        @pytest.fixture(scope="module")
        def server():
            return subprocess.Popen(["sleep", "0"])

        def test_fast(server):
            pass
    """)
    result = pytester.runpytest_inprocess("-p", "no:cacheprovider")
    result.assert_outcomes(errors=1)
    result.stdout.fnmatch_lines(["*test_inner.py::test_fast starts a process (sleep): mark it @pytest.mark.integration*"])

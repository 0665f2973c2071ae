"""nbgrader preprocessors that keep one bad submission from losing its grade or leaking hidden tests."""

from __future__ import annotations

import re

from jupyter_core.utils import run_sync
from nbclient.exceptions import CellTimeoutError, DeadKernelError
from nbformat import NotebookNode
from nbformat.v4 import new_output
from nbgrader.preprocessors import Execute, NbGraderPreprocessor
from traitlets import Integer

# The block nbgrader strips from released notebooks and feedback.
HIDDEN_BLOCK = re.compile(r"### BEGIN HIDDEN TESTS\n(.*?)### END HIDDEN TESTS", re.S)

# Error names the grader writes into a cell; autograde reads them back to fill the status column.
KERNEL_DIED = "KernelDied"
NOT_RUN = "NotRun"
CELL_TIMEOUT = "CellTimeoutError"
OUTPUT_LIMIT = "OutputLimitExceeded"


def error_output(ename: str, evalue: str) -> NotebookNode:
    """An error output as the kernel would have written it."""
    return new_output("error", ename=ename, evalue=evalue, traceback=[f"{ename}: {evalue}"])


class RobustExecute(Execute):
    """nbgrader's Execute that never aborts the notebook.

    When the kernel dies, or a timed-out cell ignores the interrupt, the kernel is stopped and every
    later code cell gets a `NotRun` error — so their test cells score 0 instead of being skipped
    (nbgrader counts a test cell without an error as passed) and the cells that already ran keep
    their points. Output beyond `max_output_chars` per cell is dropped.
    """

    max_output_chars = Integer(1_000_000, help="Output characters kept per cell.").tag(config=True)

    def preprocess(self, nb, resources=None, km=None):
        self._halted_reason: str | None = None
        self._output_chars: dict[int, int] = {}
        return super().preprocess(nb, resources, km)

    def preprocess_cell(self, cell, resources, index):
        runnable = cell.cell_type == "code" and cell.source.strip()
        if self._halted_reason is not None:
            if runnable:
                cell.outputs = [error_output(NOT_RUN, f"not run: {self._halted_reason}")]
            return cell, resources
        try:
            return super().preprocess_cell(cell, resources, index)
        except DeadKernelError:
            cell.outputs.append(error_output(KERNEL_DIED, "the kernel died while running this cell"))
            self._halted_reason = f"the kernel died in cell {index}"
        except CellTimeoutError:
            cell.outputs.append(error_output(
                CELL_TIMEOUT, f"still running after {self.timeout} s and the interrupt did not stop it"))
            self._halted_reason = f"cell {index} ran past the time limit and would not stop"
            self._stop_kernel()
        return cell, resources

    def _stop_kernel(self) -> None:
        try:
            run_sync(self.km.shutdown_kernel)(now=True)
        except Exception as exc:  # the kernel may already be gone; the batch goes on either way
            self.log.warning("could not stop the kernel: %s", exc)

    def output(self, outs, msg, display_id, cell_index):
        size = len(str(msg.get("content", "")))
        seen = self._output_chars.get(cell_index, 0)
        self._output_chars[cell_index] = seen + size
        if seen + size <= self.max_output_chars:
            return super().output(outs, msg, display_id, cell_index)
        if seen <= self.max_output_chars:
            note = error_output(OUTPUT_LIMIT, f"output beyond {self.max_output_chars} characters was dropped")
            outs.append(note)
            return note
        return None


class RedactTestOutputs(NbGraderPreprocessor):
    """In feedback, a test cell shows only the name and message of its error.

    Tracebacks quote the hidden test lines around the failure, and printed output can come from
    code that reads the test's source; the error message is written for the student and is kept,
    minus any line of the cell's hidden tests it happens to quote. Runs before ClearHiddenTests,
    while the hidden block is still in the cell.
    """

    max_message_chars = Integer(2000).tag(config=True)

    def preprocess_cell(self, cell, resources, index):
        info = cell.metadata.get("nbgrader", {})
        if cell.cell_type == "code" and info.get("grade") and not info.get("solution"):
            hidden = {line.strip() for block in HIDDEN_BLOCK.findall(cell.source + "\n")
                      for line in block.splitlines() if len(line.strip()) >= 8}
            cell.outputs = [
                error_output(out.get("ename", "Error"), self._scrub(str(out.get("evalue", "")), hidden))
                for out in cell.get("outputs", [])
                if out.get("output_type") == "error"
            ]
        return cell, resources

    def _scrub(self, message: str, hidden: set[str]) -> str:
        lines = [("[hidden test line removed]" if any(h in line for h in hidden) else line)
                 for line in message[: self.max_message_chars].splitlines()]
        return "\n".join(lines)

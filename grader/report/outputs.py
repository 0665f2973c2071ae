"""What one graded class leaves behind: grades.csv, results.json and the class report, from a run or a merge."""

from __future__ import annotations

from pathlib import Path

from grader.course import Assignment
from grader.report.report import write_report
from grader.results import Result, write_csv, write_json


def write_outputs(results: list[Result], known: dict[str, Assignment], out: Path, *, report: bool = True) -> None:
    """grades.csv, results.json and (unless `report` is False) report/ for `results`, under `out`."""
    results = sorted(results, key=lambda r: (r.student, r.assignment))
    graded = sorted({r.assignment for r in results if r.assignment in known})
    columns = [gid for name in graded for gid in (*known[name].grade_cells(), *known[name].written_cells())]
    write_csv(results, columns, out / "grades.csv")
    write_json(results, out / "results.json")
    if report:
        write_report(out)

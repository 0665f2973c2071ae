# nbgrader configuration for the course. `python -m grader` loads this file and points the
# directories at temporary folders where it needs to; plain nbgrader commands can use it too:
#   nbgrader generate_assignment 01_gradient_descent --config grader/nbgrader_config.py
from pathlib import Path

c = get_config()  # noqa: F821 — provided by traitlets when the file is loaded

c.CourseDirectory.root = str(Path(__file__).resolve().parent.parent)
c.CourseDirectory.source_directory = "solutions"
c.CourseDirectory.release_directory = "notebooks"

# Student code runs at most this long per cell at autograde; `python -m grader autograde --timeout` overrides.
c.Execute.timeout = 30
# nbgrader's own pipeline, with Execute replaced by one that never aborts the notebook: a dead or
# unstoppable kernel costs the cells after it, not the whole submission (see grader/preprocessors.py).
c.Autograde.autograde_preprocessors = [
    "grader.preprocessors.RobustExecute",
    "nbgrader.preprocessors.IgnorePattern",
    "nbconvert.preprocessors.ClearMetadataPreprocessor",
    "nbgrader.preprocessors.LimitOutput",
    "nbgrader.preprocessors.SaveAutoGrades",
    "nbgrader.preprocessors.AssignLatePenalties",
    "nbgrader.preprocessors.CheckCellMetadata",
]
# Cells tagged "demo" carry no points and only draw figures: grading skips them.
c.Execute.skip_cells_with_tag = "demo"
# A deleted test cell is put back from the source, so deleting it cannot dodge its points.
c.OverwriteCells.add_missing_cells = True
# Feedback shows the student their answers and the visible checks, never the hidden tests.
c.GenerateFeedback.preprocessors = [
    "nbgrader.preprocessors.GetGrades",
    "grader.preprocessors.RedactTestOutputs",
    "nbgrader.preprocessors.ClearHiddenTests",
    "nbconvert.preprocessors.CSSHTMLHeaderPreprocessor",
]

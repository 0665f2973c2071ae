# nbgrader configuration for the course: nbgrader generates the student notebooks (release);
# grading is the course's own (grader/grading.py), so no autograde settings live here.
#   nbgrader generate_assignment 01_gradient_descent --config grader/nbgrader_config.py
from pathlib import Path

c = get_config()  # noqa: F821 — provided by traitlets when the file is loaded

c.CourseDirectory.root = str(Path(__file__).resolve().parent.parent)
c.CourseDirectory.source_directory = "solutions"
c.CourseDirectory.release_directory = "notebooks"

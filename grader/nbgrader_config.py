# nbgrader configuration for the course: nbgrader generates the student notebooks (release);
# grading is the course's own (grader/grading.py), so no autograde settings live here.
#   nbgrader generate_assignment 01_gradient_descent --config grader/nbgrader_config.py
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from traitlets.config import Config

    def get_config() -> Config:  # provided by traitlets when the file is loaded
        ...

c = get_config()

c.CourseDirectory.root = str(Path(__file__).resolve().parent.parent)
c.CourseDirectory.source_directory = "solutions"
c.CourseDirectory.release_directory = "notebooks"

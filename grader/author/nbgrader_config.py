# nbgrader configuration for the course: nbgrader generates the student notebooks (release);
# grading is the course's own (grader/judge/grading.py), so no autograde settings live here.
#   nbgrader generate_assignment 01_gradient_descent --config grader/author/nbgrader_config.py
from typing import TYPE_CHECKING

from grader.paths import REPO

if TYPE_CHECKING:
    from traitlets.config import Config

    def get_config() -> Config:  # provided by traitlets when the file is loaded
        ...

c = get_config()

c.CourseDirectory.root = str(REPO)
c.CourseDirectory.source_directory = "solutions"
c.CourseDirectory.release_directory = "notebooks"

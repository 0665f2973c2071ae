"""The course inside nbgrader's own workflow: exchange, `nbgrader autograde`, the formgrader, feedback and export.

`python -m grader nbgrader init DIR` writes an nbgrader course directory (coursedir.py) whose nbgrader_config.py
plugs the course's grading into nbgrader's extension points (plugin.py): nbgrader keeps its gradebook, due dates,
late penalties, manual grading, feedback and export; the course's grader decides every autograded point, in its
sandboxed kernels, and nbgrader never runs a student's notebook itself.
"""

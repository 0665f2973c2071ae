"""The platforms instructors already grade on: Gradescope's autograder (gradescope.py, with the files it zips)."""

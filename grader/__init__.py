"""The instructor's grader: `python -m grader …`.

Sub-packages by stage and by trust:
- collect/  finds hand-ins (folders, LMS zips) and their times; deadlines, extensions and grade overrides.
- kernel/   everything that runs in, or talks to, a student's kernel: the probe that runs a scenario there,
            the harness that drives the kernel, the sandbox, its fork server and limits. Nothing it
            receives is trusted.
- judge/    decides: hidden tests as scenarios, the trusted comparison with the reference run, grading.
- author/   the course's own tools: release and check, mutants and cribs, the self-test, the set-up
            cell, the student edition, the lecturer's demo.
- report/   what people read: feedback pages, the class report (with similar hand-ins), LMS exports.
- batch/    a whole class: autograde's parallel workers, shards and merge.
- platforms/ the platforms instructors grade on: the Gradescope autograder zip and what it runs per submission.
"""

"""The course's plumbing that ships beside `helpers` to every kernel and every student.

Not lesson code: the vocabulary of cell kinds, the names a hidden scenario uses, a notebook runner,
the pre-submission check (`python -m labkit.validate`) and the rank server behind notebook 07's
`run_ranks`. Nothing runs at import.
"""

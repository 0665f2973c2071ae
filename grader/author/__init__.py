"""The course author's tools: release and check, mutants and cribs, the self-test, the set-up cell, the
student edition and the lecturer's demo."""

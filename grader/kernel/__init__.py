"""The student's side of the trust wall: what runs in, or talks to, a student's kernel.

Nothing here decides a grade, and nothing a kernel sends is trusted: the probe runs a scenario and
sends plain data, the harness drives the kernel and collects it, the sandbox (fork server, limits,
kernelspec) confines it. Deciding happens in grader/judge/.
"""

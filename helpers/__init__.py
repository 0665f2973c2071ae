"""What the course notebooks import: lesson code only, one module per idea, nothing runs at import.

checks (01) · data (01) · plots (01) · exercises (01) · devices (00) · graphs (00) · saved_memory (04)
· preflight (05) · precision (06) · distributed (07)
"""

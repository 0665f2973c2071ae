"""What the course notebooks import: one module per idea, nothing runs at import.

checks (01) · data (01) · plots (01) · devices (00) · graphs (00) · validate (00) · saved_memory (04)
· preflight (05) · precision (06) · distributed (07) · rank_server (07)
"""

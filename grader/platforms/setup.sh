#!/usr/bin/env bash
# Gradescope runs this once, as root, when it builds the autograder's image (Ubuntu 22.04): it installs the course
# in /autograder/source/.venv and prepares everything a submission's grading would otherwise redo (the grading
# templates, the reference solution's records, the known mistakes), so each submission only grades.
set -euo pipefail
SOURCE=/autograder/source
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends python3 python3-pip ca-certificates >/dev/null
# The pins need Python 3.11 and Ubuntu 22.04's python3 is 3.10: uv installs a standalone CPython 3.11, outside
# /root so that the unprivileged user who runs student code (where the sandbox cannot be built) can run it too.
python3 -m pip install --quiet uv==0.13.8
export UV_PYTHON_INSTALL_DIR=/opt/uv-python
uv venv --quiet --seed --python 3.11 "$SOURCE/.venv"
PY="$SOURCE/.venv/bin/python"
# torch first, the CPU build (the course supports torch >= 2.11, < 2.15; requirements.txt pins the tested one) …
"$PY" -m pip install --quiet "$(grep -E '^torch==' "$SOURCE/requirements-gradescope.txt")" \
    --index-url https://download.pytorch.org/whl/cpu
# … then the other pins (without the developers' tools), and the course itself.
"$PY" -m pip install --quiet -r "$SOURCE/requirements-gradescope.txt"
"$PY" -m pip install --quiet --no-deps -e "$SOURCE"
# Who runs student code where user namespaces are not allowed (Gradescope's best practices: a user of its own).
id -u tml-student >/dev/null 2>&1 || useradd --system --no-create-home --shell /usr/sbin/nologin tml-student
cd "$SOURCE"
"$PY" -m grader.platforms.gradescope prepare

#!/usr/bin/env bash
# The GPU check; tools/gpu_check.py says what it does and what it writes.
exec "${PYTHON:-python3}" "$(dirname "$0")/gpu_check.py" "$@"

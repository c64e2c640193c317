#!/bin/sh
# Generate an agent identity: a key file (mode 0600) whose DID is printed as the last line.
#
#   scripts/keygen.sh KEY_FILE [--agent-id ID] [--force]
#
# Runs the installed `a2a-secure` command, or `$PYTHON -m a2a_secure` when PYTHON is set or
# the command is not on PATH. Without --force an existing KEY_FILE is left alone (exit 1).
set -eu

if [ "$#" -lt 1 ] || [ "$1" = "-h" ] || [ "$1" = "--help" ]; then
    echo "usage: $0 KEY_FILE [--agent-id ID] [--force]" >&2
    exit 2
fi
out=$1
shift

if [ -n "${PYTHON:-}" ]; then
    exec "$PYTHON" -m a2a_secure keygen --out "$out" "$@"
elif command -v a2a-secure >/dev/null 2>&1; then
    exec a2a-secure keygen --out "$out" "$@"
else
    exec python3 -m a2a_secure keygen --out "$out" "$@"
fi

#!/bin/bash
# The image's entrypoint: start ascend-serve with the arguments given (Triton's flag names).
# On the Ascend image (ASCEND_SERVE_VARIANT=ascend) CANN's set_env.sh is sourced first, in this
# shell, so that pyACL is importable and its libraries are found by the server it execs.
# Arguments that do not start with "-" run as a command instead (e.g. `bash` for debugging).
set -euo pipefail

if [[ "${ASCEND_SERVE_VARIANT:-cpu}" == "ascend" ]]; then
    set_env="${ASCEND_SET_ENV:-/usr/local/Ascend/ascend-toolkit/set_env.sh}"
    if [[ ! -r "$set_env" ]]; then
        echo "ascend-serve: CANN environment script $set_env not found;" \
             "build on a CANN base image or set ASCEND_SET_ENV" >&2
        exit 1
    fi
    # set_env.sh reads unset variables (LD_LIBRARY_PATH, PYTHONPATH, ...).
    set +u
    # shellcheck source=/dev/null
    source "$set_env"
    set -u
fi

if [[ $# -gt 0 && "$1" != -* ]]; then
    exec "$@"
fi
exec ascend-serve "$@"

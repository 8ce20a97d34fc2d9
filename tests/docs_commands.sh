#!/bin/sh
# docs_commands.sh NTPC BUILD_DIR FILE.md... [options] — run every command shown in the
# documentation, as docs/testing.md ("Commands in the documentation") describes; run from the
# source root. The work is done by docs_commands.py beside this file (python3, standard library).
exec python3 "$(dirname "$0")/docs_commands.py" "$@"

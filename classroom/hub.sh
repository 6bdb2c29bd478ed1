#!/usr/bin/env bash
# Stand the workshop hub up on this node: checks, the slice plan, then JupyterHub in the foreground.
#
#   sudo LABS_SLICE_SIZE=2 classroom/hub.sh          # Ctrl-C stops the hub and every learner's server
#
# Run it as root from the course's environment (the one `pip install -r requirements.txt` made), with
# configurable-http-proxy on PATH (`npm install -g configurable-http-proxy`). Settings: see the top
# of classroom/jupyterhub_config.py; the state (database, cookie secret, slices.json) goes to
# LABS_STATE_DIR, default /srv/labs-hub.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
python="${LABS_PYTHON:-$(command -v python)}"
[ "$(id -u)" = 0 ] || { echo "hub.sh: run it as root (the hub starts each learner's server as that learner). HINT: sudo -E $0" >&2; exit 2; }
command -v configurable-http-proxy >/dev/null || { echo "hub.sh: configurable-http-proxy is not on PATH. HINT: npm install -g configurable-http-proxy" >&2; exit 2; }
"$python" -c "import jupyterhub, jupyterhub_idle_culler, labutils" 2>/dev/null || { echo "hub.sh: $python lacks jupyterhub, jupyterhub-idle-culler or labutils. HINT: activate the course's environment, then pip install -r requirements.txt" >&2; exit 2; }
if [ "${LABS_SPAWNER:-systemd}" = systemd ]; then
    "$python" -c "import systemdspawner" 2>/dev/null || { echo "hub.sh: LABS_SPAWNER=systemd needs jupyterhub-systemdspawner. HINT: pip install jupyterhub-systemdspawner" >&2; exit 2; }
fi
export LABS_STATE_DIR="${LABS_STATE_DIR:-/srv/labs-hub}"
mkdir -p "$LABS_STATE_DIR" && chmod 700 "$LABS_STATE_DIR"
echo "== the node's slices (size ${LABS_SLICE_SIZE:-2}):"
"$python" -m labutils classroom check --slice-size "${LABS_SLICE_SIZE:-2}" || echo "(see above: the hub starts anyway; a failing slice fails its learner's labs)"
cd "$LABS_STATE_DIR"
exec "$python" -m jupyterhub -f "$here/jupyterhub_config.py"

#!/usr/bin/env bash
# Installs the distributed file systems the umbrella layer is tested and measured over
# (scripts/distfs/gluster.sh, juicefs.sh). Called by scripts/install-deps.sh; each engine
# that does not install is reported, and its tests say so (they fail in CI).
set -uo pipefail
cd "$(dirname "$0")"
rc=0
bash gluster.sh install || { echo "distfs: GlusterFS did not install" >&2; rc=1; }
bash juicefs.sh install || { echo "distfs: JuiceFS did not install" >&2; rc=1; }
exit $rc

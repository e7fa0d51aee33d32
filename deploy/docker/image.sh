#!/bin/sh
# The steps both image targets share (Dockerfile: cpu and cuda), so that they cannot drift apart:
#   image.sh user                  the non-root user basal (uid 10001, home /data) and /data, owned by it
#   image.sh torch [PIP OPTION...] a venv in /opt/venv with torch at the lock's version (/tmp/lock.txt); a layer
#                                  of its own, so a change to basal's code does not download torch again
#   image.sh basal EXTRAS [PIP OPTION...]   basal's wheel (/tmp/wheel/) with EXTRAS, from the lock; pip check
set -eu
step="$1"
shift
case "$step" in
user)
  useradd --system --uid 10001 --user-group --home-dir /data --no-create-home --shell /usr/sbin/nologin basal
  mkdir -p /data
  chown basal:basal /data
  ;;
torch)
  python3 -m venv /opt/venv
  /opt/venv/bin/pip install --no-cache-dir -q "$@" -c /tmp/lock.txt torch
  ;;
basal)
  extras="$1"
  shift
  wheel="$(ls /tmp/wheel/basal_bitwise-*.whl)"
  /opt/venv/bin/pip install --no-cache-dir -q "$@" -c /tmp/lock.txt "${wheel}${extras:+[$extras]}"
  /opt/venv/bin/pip check
  ;;
*)
  echo "image.sh: unknown step $step (user, torch, basal)" >&2
  exit 2
  ;;
esac

#!/usr/bin/env bash
# A Debian 12 base image with python3 3.11 and venv, for machines that reach Debian's package mirror but no
# container registry (this project's machines): `make image-base`, then `make image BASE=basal-base:bookworm`.
# Built with mmdebstrap from the host's apt sources, with the host's CA bundle; needs root, mmdebstrap and docker.
set -euo pipefail
tag="${1:-basal-base:bookworm}"
sources="${APT_SOURCES:-/etc/apt/sources.list.d/debian.sources}"
[ -f "$sources" ] || sources=/etc/apt/sources.list
mmdebstrap --quiet --variant=minbase --include=python3,python3-venv,ca-certificates \
  --customize-hook='upload /etc/ssl/certs/ca-certificates.crt /etc/ssl/certs/ca-certificates.crt' \
  bookworm - "$sources" | docker import - "$tag"
docker run --rm --network host "$tag" python3 -c 'import sys, venv; print("base:", sys.version.split()[0])'

#!/usr/bin/env bash
# Installs the Debian packages the test suite drives (real origins, real clients), only when missing.
set -euo pipefail

# command → Debian package
declare -A wanted=(
  [curl]=curl
  [nginx]=nginx-light
  [chromium]=chromium
  [certutil]=libnss3-tools
  [tshark]=tshark
  [prometheus]=prometheus
  [node]=nodejs
  [npm]=npm
  [go]=golang-go
  [htpasswd]=apache2-utils
  [apache2]=apache2
  [logrotate]=logrotate
  [slapd]=slapd
)

missing=()
for cmd in "${!wanted[@]}"; do
  command -v "$cmd" >/dev/null 2>&1 || missing+=("${wanted[$cmd]}")
done

if ((${#missing[@]} == 0)); then
  exit 0
fi
if [[ $(id -u) -ne 0 ]]; then
  echo "install-system-deps: missing ${missing[*]}; run as root or install them: apt-get install ${missing[*]}" >&2
  exit 1
fi
echo "install-system-deps: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
# Debian starts the services it installs (apache2, nginx on :80); the tests run their own
# instances, so policy-rc.d's exit 101 forbids that for this install (when none is there).
policy=/usr/sbin/policy-rc.d
if [[ ! -e $policy ]]; then
  printf '#!/bin/sh\nexit 101\n' >"$policy"
  chmod 755 "$policy"
  trap 'rm -f "$policy"' EXIT
fi
# tshark asks whether non-root users may capture; the default answer is fine.
apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null

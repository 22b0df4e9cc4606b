#!/bin/bash
# Installs the strata binary from an HTTPS URL ($1), refusing it unless its SHA-256 is $2.
set -euo pipefail
url="$1"
sha256="$2"

tmp="$(mktemp)"
trap 'rm -f "$tmp"' EXIT
curl --fail --silent --show-error --location --proto '=https' --tlsv1.2 --retry 5 --output "$tmp" "$url"
if ! echo "$sha256  $tmp" | sha256sum --check --status; then
  echo "strata-install: $url does not have the SHA-256 $sha256" >&2
  exit 1
fi
install -m 0755 -o root -g root "$tmp" /usr/local/bin/strata
id strata >/dev/null 2>&1 || useradd --system --no-create-home --home-dir /var/lib/strata --shell /sbin/nologin strata

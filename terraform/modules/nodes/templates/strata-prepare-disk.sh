#!/bin/bash
# Mounts the instance's local NVMe disks (the instance store of an i4i / i3en instance) on
# $1 as one XFS file system, striped (RAID 0) when there are several. Runs at every boot
# (strata-disk.service): after a stop/start the instance store comes back empty, gets a new
# file system, and the broker refills its replicas from its peers.
set -euo pipefail
mount_point="${1:-/var/lib/strata}"

if mountpoint -q "$mount_point"; then
  exit 0
fi

disks=()
for dev in /sys/block/nvme*n1; do
  [ -e "$dev" ] || continue
  if grep -q "Amazon EC2 NVMe Instance Storage" "$dev/device/model" 2>/dev/null; then
    disks+=("/dev/$(basename "$dev")")
  fi
done
if [ "${#disks[@]}" -eq 0 ]; then
  echo "strata-prepare-disk: no instance-store NVMe disk (is this an i4i or i3en instance?)" >&2
  exit 1
fi

if [ "${#disks[@]}" -eq 1 ]; then
  device="${disks[0]}"
else
  device=/dev/md/strata
  if [ ! -e "$device" ]; then
    mdadm --assemble "$device" "${disks[@]}" 2>/dev/null ||
      mdadm --create "$device" --run --level=0 --raid-devices="${#disks[@]}" "${disks[@]}"
  fi
fi

if ! blkid -o value -s TYPE "$device" >/dev/null 2>&1; then
  mkfs.xfs -f -L strata-data "$device"
fi
mkdir -p "$mount_point"
mount -o noatime "$device" "$mount_point"
id strata >/dev/null 2>&1 || useradd --system --no-create-home --home-dir "$mount_point" --shell /sbin/nologin strata
chown strata:strata "$mount_point"
chmod 0750 "$mount_point"

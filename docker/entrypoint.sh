#!/bin/sh
# The rewardq image's entrypoint: make the cgroup filesystem writable, then run `rewardq "$@"`.
#
# Docker mounts /sys/fs/cgroup read-only in a container that is not privileged; the local code
# sandbox gives every job a cgroup of its own below the container's (docs/code-execution.md),
# so it needs it read-write. Remounting needs CAP_SYS_ADMIN and an AppArmor profile that allows
# mount, as docker-compose.yml grants; without them the worker still starts, and refuses code
# data sources naming the fix.
set -e
if [ "$(id -u)" = 0 ]; then
  # every cgroup mount at or below /sys/fs/cgroup that is read-only (v2: one; v1: one per controller)
  awk '{ for (i = 7; i < NF; i++) if ($i == "-") { type = $(i + 1); break } }
       type ~ /^cgroup2?$/ && $5 ~ "^/sys/fs/cgroup" && $6 ~ /(^|,)ro(,|$)/ { print $5 }' /proc/self/mountinfo |
    while read -r point; do
      mount -o remount,rw "$point" 2>/dev/null ||
        echo "rewardq-entrypoint: $point is read-only and cannot be remounted (needs CAP_SYS_ADMIN and AppArmor unconfined)" >&2
    done
fi
exec rewardq "$@"

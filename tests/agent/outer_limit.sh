#!/usr/bin/env bash
# Runs a command under an outer limit so an escape test that fails cannot take the machine down:
# a pids cgroup (v1 or v2, when writable) capping the whole tree at OUTER_PIDS processes, and a
# hard wall-clock kill after OUTER_SECONDS. Usage: outer_limit.sh CMD ARGS...
set -u
pids=${OUTER_PIDS:-1024}
secs=${OUTER_SECONDS:-120}
cg=""
for base in /sys/fs/cgroup/pids /sys/fs/cgroup; do
  if [[ -w "$base" && -e "$base/cgroup.procs" ]]; then
    dir="$base/fathom-outer-$$"
    if mkdir "$dir" 2>/dev/null; then
      if [[ -e "$dir/pids.max" ]] && echo "$pids" > "$dir/pids.max" && echo $$ > "$dir/cgroup.procs"; then
        cg="$dir"; break
      fi
      rmdir "$dir" 2>/dev/null
    fi
  fi
done
if [[ -z "$cg" ]]; then
  ulimit -u "$pids" 2>/dev/null || true  # binds only for non-root; the inner sandbox is the real limit
fi
timeout -s KILL "$secs" "$@"
rc=$?
if [[ -n "$cg" ]]; then
  # Anything left (there should be nothing) is killed before the cgroup goes.
  for p in $(cat "$cg/cgroup.procs" 2>/dev/null); do [[ $p != $$ ]] && kill -9 "$p" 2>/dev/null; done
  echo $$ > "$(dirname "$cg")/cgroup.procs" 2>/dev/null
  rmdir "$cg" 2>/dev/null
fi
exit $rc

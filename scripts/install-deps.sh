#!/usr/bin/env bash
# Installs what building and testing Fathom needs, and nothing when it is all present (fast, silent).
# Debian packages through apt-get; test peers from the npm registry into tests/npm/<suite>/.
# Idempotent: safe to run before every build.
set -euo pipefail
cd "$(dirname "$0")/.."

PACKAGES=(
  g++ cmake ninja-build ccache pkg-config make git
  libgtest-dev libgmock-dev libfmt-dev nlohmann-json3-dev libcpp-httplib-dev
  libpcre2-dev libutf8proc-dev libxxhash-dev
  librocksdb-dev liburing-dev fio
  libopenmpi-dev openmpi-bin
  libseccomp-dev libsqlite3-dev sqlite3 libtomlplusplus-dev libssl-dev
  clang libclang-rt-14-dev
  python3
  libopenblas-dev
  groff-base
  iproute2
)

missing=()
for p in "${PACKAGES[@]}"; do
  status=$(dpkg-query -W -f='${Status}' "$p" 2>/dev/null || true)
  [[ "$status" == "install ok installed" ]] || missing+=("$p")
done
command -v node >/dev/null 2>&1 || missing+=(nodejs)
command -v npm >/dev/null 2>&1 || missing+=(npm)

if ((${#missing[@]})); then
  echo "install-deps: installing ${missing[*]}" >&2
  SUDO=""
  [[ $(id -u) -eq 0 ]] || SUDO="sudo"
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -qq
  $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

# npm test peers, pinned by each suite's package-lock.json.
for pkg in tests/npm/*/package.json; do
  [[ -e "$pkg" ]] || continue
  dir=$(dirname "$pkg")
  stamp="$dir/node_modules/.package-lock.json"
  if [[ ! -e "$stamp" || "$dir/package-lock.json" -nt "$stamp" || "$pkg" -nt "$stamp" ]]; then
    echo "install-deps: npm ci in $dir" >&2
    if [[ -e "$dir/package-lock.json" ]]; then
      (cd "$dir" && npm ci --no-audit --no-fund --loglevel=error >/dev/null)
    else
      (cd "$dir" && npm install --no-audit --no-fund --loglevel=error >/dev/null)
    fi
  fi
done

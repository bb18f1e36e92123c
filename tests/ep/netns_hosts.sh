#!/usr/bin/env bash
# Runs a command under mpirun across "hosts" made of network namespaces on this machine: each
# host is a namespace with its own hostname (UTS namespace) and address 10.213.0.<i+1> on a bridge
# in a hub namespace, so Open MPI treats them as separate nodes and connects them over TCP. The
# root namespace is left untouched. Exits 77 (skipped) where namespaces cannot be created.
#   netns_hosts.sh HOSTS RANKS_PER_HOST -- program args...
set -euo pipefail
hosts=$1 per_host=$2
shift 3
id="fep$$"
ns_of() { echo "${id}h$1"; }
cleanup() {
  for ((i = 0; i < hosts; ++i)); do ip netns del "$(ns_of "$i")" 2>/dev/null || true; done
  ip netns del "${id}hub" 2>/dev/null || true
  rm -rf "$tmp"
}
tmp=$(mktemp -d)
trap cleanup EXIT
if ! ip netns add "${id}hub" 2>/dev/null; then
  echo "netns_hosts: cannot create network namespaces here; skipping" >&2
  exit 77
fi
ip -n "${id}hub" link add br0 type bridge
ip -n "${id}hub" link set br0 up
for ((i = 0; i < hosts; ++i)); do
  ns=$(ns_of "$i")
  ip netns add "$ns"
  ip link add "${id}a$i" type veth peer name "${id}b$i"
  ip link set "${id}a$i" netns "$ns"
  ip link set "${id}b$i" netns "${id}hub"
  ip -n "${id}hub" link set "${id}b$i" master br0 up
  ip -n "$ns" addr add "10.213.0.$((i + 1))/24" dev "${id}a$i"
  ip -n "$ns" link set "${id}a$i" up
  ip -n "$ns" link set lo up
done
# Open MPI's remote launcher: "agent HOST command..." runs the command in HOST's namespace.
cat > "$tmp/agent" <<AGENT
#!/usr/bin/env bash
host=\$1; shift
i=\$(( \${host##*.} - 1 ))
exec ip netns exec "${id}h\$i" unshare --uts sh -c "hostname epnode\$i; \$*"
AGENT
chmod +x "$tmp/agent"
hostlist=""
for ((i = 0; i < hosts; ++i)); do hostlist+="${hostlist:+,}10.213.0.$((i + 1)):$per_host"; done
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
# The ranks get the test's FATHOM_* settings and sanitizer options (only those that are set).
forward=""
for v in $(compgen -e | grep -E '^(FATHOM_|OMPI_MCA_|PMIX_MCA_|LSAN_OPTIONS|ASAN_OPTIONS|UBSAN_OPTIONS)'); do
  forward+=" -x $v"
done
ip netns exec "$(ns_of 0)" unshare --uts sh -c "hostname epnode0; exec mpirun --oversubscribe --bind-to none \
  -H $hostlist -np $((hosts * per_host)) --mca plm_rsh_agent $tmp/agent --mca pml ob1 --mca btl self,tcp \
  --mca btl_tcp_if_include 10.213.0.0/24 --mca oob_tcp_if_include 10.213.0.0/24 $forward $(printf '%q ' "$@")"

#!/usr/bin/env bash
# Smoke test for tools/testcluster: builds a 3-host cluster under its own prefix,
# checks ssh, host names, dotted names, addressing, status and idempotence, then
# tears it down and checks nothing is left. Needs root; skips otherwise.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
tc="$here/tools/testcluster"
prefix=${SMOKE_PREFIX:-smk}
state=/tmp/treecast-testcluster-$prefix

if [[ $(id -u) -ne 0 ]]; then
    echo "SKIP: tools/testcluster needs root"
    exit 0
fi
unset TREECAST_TESTCLUSTER_DIR

fail() { echo "FAIL: $*" >&2; exit 1; }
ok() { echo "ok: $*"; }
cleanup() { "$tc" down --prefix "$prefix" >/dev/null 2>&1 || true; }
trap cleanup EXIT

"$tc" up 3 --prefix "$prefix" >/dev/null || fail "up 3"
ok "up 3"

cfg="$state/ssh_config"
[[ -f $cfg && -f $state/hosts ]] || fail "ssh_config or hosts missing in $state"
for k in 1 2 3; do
    got=$(ssh -F "$cfg" "$prefix$k" hostname) || fail "ssh $prefix$k"
    [[ $got == "$prefix$k" ]] || fail "ssh $prefix$k hostname printed '$got'"
done
ok "ssh HOST hostname prints the host name"

got=$(ssh -F "$cfg" "${prefix}2.cluster.test" hostname) || fail "ssh ${prefix}2.cluster.test"
[[ $got == "${prefix}2" ]] || fail "dotted name gave '$got'"
ok "dotted host name"

addr2=$(awk -v h="${prefix}2" '$1 == h {print $2}' "$state/hosts")
subnet=${addr2%.*}
ip -n "treecast-${prefix}1" -4 addr show dev eth0 | grep -q "brd $subnet.255" ||
    fail "no broadcast address $subnet.255 on ${prefix}1"
ok "broadcast address $subnet.255"

# Host to host, through the bridge (bash /dev/tcp: no ping needed).
ip netns exec "treecast-${prefix}1" timeout 5 bash -c \
    "exec 3<>/dev/tcp/$addr2/22 && IFS= read -r l <&3 && [[ \$l == SSH-* ]]" ||
    fail "${prefix}1 cannot reach $addr2:22"
got=$(ssh -F "$cfg" "${prefix}1" "ssh -F $cfg ${prefix}3.cluster.test hostname") ||
    fail "nested ssh ${prefix}1 -> ${prefix}3"
[[ $got == "${prefix}3" ]] || fail "nested ssh gave '$got'"
ok "host to host"

got=$(TREECAST_SMOKE=yes ssh -F "$cfg" -o SendEnv=TREECAST_SMOKE "${prefix}1" 'echo "$TREECAST_SMOKE"')
[[ $got == yes ]] || fail "TREECAST_* not accepted (got '$got')"
ok "AcceptEnv TREECAST_*"

"$tc" status --prefix "$prefix" >/dev/null || fail "status"
ok "status"

pid_before=$(cat "$state/nodes/${prefix}1/sshd.pid")
"$tc" up 3 --prefix "$prefix" >/dev/null 2>&1 || fail "second up 3"
[[ $(cat "$state/nodes/${prefix}1/sshd.pid") == "$pid_before" ]] || fail "second up rebuilt a healthy cluster"
ok "up is idempotent"

"$tc" up 2 --prefix "$prefix" >/dev/null 2>&1 || fail "up 2 after up 3"
[[ $(ip netns list | grep -c "^treecast-${prefix}[0-9]") -eq 2 ]] || fail "up 2 did not shrink the cluster"
ok "up with another N rebuilds"

"$tc" up 2 --prefix "$prefix" --rate 1gbit --rails 2 >/dev/null 2>&1 || fail "up 2 --rate 1gbit --rails 2"
for dev in eth0 eth1; do
    ip netns exec "treecast-${prefix}1" tc qdisc show dev "$dev" | grep -q "tbf.*rate 1Gbit" ||
        fail "${prefix}1 $dev is not shaped to 1 Gbit/s"
done
for link in "${prefix}v1" "${prefix}w2" "${prefix}br0" "${prefix}br1"; do
    tc qdisc show dev "$link" | grep -q "tbf.*rate 1Gbit" || fail "bridge port $link is not shaped"
done
addr2r=$(awk -v h="${prefix}2-r2" '$1 == h {print $2}' "$state/hosts-rail2")
[[ -n $addr2r ]] || fail "no rail-2 address for ${prefix}2 in hosts-rail2"
got=$(ssh -F "$cfg" "${prefix}1" "ssh -F $cfg ${prefix}2-r2 hostname") || fail "ssh ${prefix}1 -> ${prefix}2-r2 ($addr2r)"
[[ $got == "${prefix}2" ]] || fail "ssh ${prefix}2-r2 hostname gave '$got'"
ok "--rate shapes both ends of both rails, rail 2 carries traffic"
"$tc" wire --prefix "$prefix" --mib 20 | grep -q "rail 2 .* % of the rate" || fail "wire"
ok "wire measures both rails"

"$tc" down --prefix "$prefix" >/dev/null 2>&1 || fail "down"
"$tc" down --prefix "$prefix" >/dev/null 2>&1 || fail "second down"
! ip netns list | grep -q "^treecast-${prefix}[0-9]" || fail "namespaces left"
! ip -o link show | grep -Eq ": (${prefix}br[01]|${prefix}[vpwq][0-9]+)[@:]" || fail "links left"
[[ ! -e $state ]] || fail "state dir left"
! pgrep -f "$state/nodes/" >/dev/null || fail "sshd left running"
ok "down leaves nothing behind"
echo "PASS"

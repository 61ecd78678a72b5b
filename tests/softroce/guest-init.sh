#!/bin/bash
# PID 1 of a Soft-RoCE guest (the image's stub execs it from the staged repository disk).
# Brings up its NICs (one per twin of each of its ring ports, as its ring spec
# /mnt/repo/.softroce/rank<r>.json lays them out: the first twin of a port with the address, the
# second without) and an rxe device on each, runs the lane's phases against its neighbours with a
# bound on every wait, records each phase in /results/status.tsv (phase, pass|fail|skip, seconds,
# detail) with its log beside it, writes /results as a tar onto the results disk (/dev/vdc) and
# powers off. Rank 0 is the server side of the perftest phases (cable 0, ranks 0 and 1).
set -u
export PATH=/usr/sbin:/usr/bin:/sbin:/bin HOME=/root LANG=C.UTF-8 PYTHONDONTWRITEBYTECODE=1
REPO=/mnt/repo
RESULTS=/results

arg() { sed -n "s/.*\bsr\.$1=\([^ ]*\).*/\1/p" /proc/cmdline; }
RANK=$(arg rank)
MTU=$(arg mtu)
PHASES=$(arg phases)
SPEC=$REPO/.softroce/rank$RANK.json
ROLE=server
((RANK == 0)) || ROLE=client
# The phases run in child shells (under timeout): they see these.
export REPO RESULTS RANK MTU ROLE SPEC

# spec FIELD: one line per twin of the ring spec, "interface address|- device peer_address"
# (address only on a port's first twin); FIELD=ports gives "address peer_address peer_rank".
spec() {
	python3 - "$SPEC" "$1" <<'EOF'
import json, sys
doc = json.load(open(sys.argv[1]))
for port in doc["ports"]:
    if sys.argv[2] == "ports":
        print(port["address"], port["peer_address"], port["peer_rank"])
        continue
    for twin in port["twins"]:
        print(twin["interface"], twin["address"] or "-", twin["rdma_device"], port["peer_address"])
EOF
}

say() { echo "SOFTROCE rank$RANK $*" >/dev/console; }

# run_phase NAME BOUND_SECONDS FUNCTION: runs FUNCTION under a wall-clock bound, logging to
# $RESULTS/NAME.log; FUNCTION prints its one-line detail last, or exits 77 to skip.
run_phase() {
	local name=$1 bound=$2 fn=$3 start rc status detail
	if [[ $PHASES != all && ",$PHASES," != *",$name,"* ]]; then
		return 0
	fi
	say "phase $name: start (bound ${bound} s)"
	start=$EPOCHREALTIME
	timeout -k 5 "$bound" bash -c "$(declare -f); $fn" >"$RESULTS/$name.log" 2>&1
	rc=$?
	detail=$(tail -n 1 "$RESULTS/$name.log" | tr -d '\r\t')
	case $rc in
	0) status=pass ;;
	77) status=skip ;;
	124 | 137) status=fail detail="timed out after ${bound} s; last line: $detail" ;;
	*) status=fail detail="exit $rc; last line: $detail" ;;
	esac
	printf '%s\t%s\t%.1f\t%s\n' "$name" "$status" "$(bc_sub "$EPOCHREALTIME" "$start")" "$detail" >>"$RESULTS/status.tsv"
	# rxe's counters (retransmits, duplicates, sequence errors) after each phase explain a failure.
	printf '%s\t%s\n' "$name" "$(rxe_counters)" >>"$RESULTS/rxe_counters.tsv"
	say "phase $name: $status: $detail"
}

# Every rxe device's counters: sent/received packets per twin show the striping.
rxe_counters() {
	local f dev
	for dev in /sys/class/infiniband/rxe*; do
		for f in "$dev"/ports/1/hw_counters/*; do
			[[ -r $f ]] && printf '%s.%s=%s ' "${dev##*/}" "${f##*/}" "$(cat "$f")"
		done
	done
}

bc_sub() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.1f", a - b }'; }

# retry_until SECONDS CMD...: a client's connect may precede the server's listen; retry
# (bounded) until the command succeeds.
retry_until() {
	local deadline=$((SECONDS + $1)) attempt=0
	shift
	until "$@"; do
		((++attempt, SECONDS < deadline)) || return 1
		echo "attempt $attempt failed; retrying"
		sleep 2
	done
}

# The guest's network interfaces other than loopback.
nics() {
	local dev
	for dev in /sys/class/net/*; do
		[[ ${dev##*/} == lo ]] || echo "${dev##*/}"
	done
}

phase_net() {
	local want have iface address _dev _peer
	want=$(spec twins | wc -l)
	have=$(nics | wc -l)
	# The guest must be on no network but its cables: one NIC per twin of each port.
	[[ $have == "$want" ]] || { echo "expected $want NICs (one per twin), found: $(nics | tr '\n' ' ')"; return 1; }
	ip link set lo up
	while read -r iface address _dev _peer; do
		ip link set "$iface" mtu "$MTU" up
		[[ $address == - ]] || ip addr add "$address/24" dev "$iface"
	done < <(spec twins)
	for iface in $(nics); do
		for _ in $(seq 50); do
			[[ $(cat "/sys/class/net/$iface/operstate") == up ]] && break
			sleep 0.2
		done
	done
	ip -br addr
	ip route
	spec twins | while read -r iface address _dev _peer; do
		printf '%s %s mtu %s %s; ' "$iface" "$([[ $address == - ]] && echo no-ipv4 || echo "$address/24")" \
			"$(cat "/sys/class/net/$iface/mtu")" "$(cat "/sys/class/net/$iface/operstate")"
	done
	echo
}

# gid_of DEVICE PATTERN: the first RoCE v2 GID index whose GID matches PATTERN (a bash glob).
gid_of() {
	local i gid
	for i in $(seq 0 15); do
		gid=$(cat "/sys/class/infiniband/$1/ports/1/gids/$i" 2>/dev/null) || continue
		[[ $gid == $2 && $(cat "/sys/class/infiniband/$1/ports/1/gid_attrs/types/$i" 2>/dev/null) == "RoCE v2" ]] &&
			{ echo "$i"; return 0; }
	done
	return 1
}

phase_rxe() {
	local iface address dev _peer a b c d pattern index
	modprobe -a ib_uverbs rdma_rxe
	while read -r iface address dev _peer; do
		rdma link add "$dev" type rxe netdev "$iface"
	done < <(spec twins)
	rdma link show
	while read -r iface address dev _peer; do
		# The first twin: the IPv4-mapped GID of its address; the second: a link-local GID.
		if [[ $address == - ]]; then
			pattern='fe80:0000:0000:0000:*'
		else
			IFS=. read -r a b c d <<<"$address"
			pattern=$(printf '0000:0000:0000:0000:0000:ffff:%02x%02x:%02x%02x' "$a" "$b" "$c" "$d")
		fi
		for _ in $(seq 50); do
			index=$(gid_of "$dev" "$pattern") && break
			sleep 0.2
		done
		[[ -n $index ]] || { echo "$dev on $iface: no RoCE v2 GID like $pattern"; return 1; }
		printf '%s on %s: %s, gid[%s] RoCE v2 %s; ' "$dev" "$iface" \
			"$(ibv_devinfo -d "$dev" | grep -m1 active_mtu | tr -s ' \t' ' ' | sed 's/^ //')" "$index" \
			"$(cat "/sys/class/infiniband/$dev/ports/1/gids/$index")"
		index=
	done < <(spec twins)
	echo
}

phase_ping() {
	local address peer _rank
	while read -r address peer _rank; do
		retry_until 60 ping -c 1 -W 2 "$peer" || return 1
		printf '%s -> %s: %s; ' "$address" "$peer" "$(ping -c 5 -i 0.2 -W 2 "$peer" | tail -n 2 | tr '\n' ' ')"
	done < <(spec ports)
	echo
}

# perftest runs on cable 0's first twin (rxe0 of ranks 0 and 1), at its IPv4 GID.
perftest_ready() {
	((RANK <= 1)) || { echo "perftest runs on cable 0 (ranks 0 and 1) only"; exit 77; }
	GID=$(gid_of rxe0 '0000:0000:0000:0000:0000:ffff:*') || { echo "rxe0 has no IPv4 RoCE v2 GID"; exit 1; }
	PEER=$(spec ports | head -n 1 | cut -d' ' -f2)
}

phase_rc_pingpong() {
	perftest_ready
	local cmd=(ibv_rc_pingpong -d rxe0 -g "$GID" -n 200)
	if [[ $ROLE == server ]]; then
		"${cmd[@]}"
	else
		retry_until 90 "${cmd[@]}" "$PEER"
	fi | tee /tmp/pingpong.out
	[[ ${PIPESTATUS[0]} == 0 ]] || return 1
	grep -E 'bytes in|iters in' /tmp/pingpong.out | tr '\n' ' '
	echo
}

phase_write_bw() {
	perftest_ready
	local cmd=(ib_write_bw -d rxe0 -x "$GID" -p 18516 -s 65536 -n 1000 -F)
	if [[ $ROLE == server ]]; then
		"${cmd[@]}"
	else
		retry_until 90 "${cmd[@]}" "$PEER"
	fi | tee /tmp/write_bw.out
	[[ ${PIPESTATUS[0]} == 0 ]] || return 1
	awk '/#bytes/ { getline; print "bytes " $1 " iterations " $2 " BW average " $4 " MB/sec" }' /tmp/write_bw.out
}

# The project's verbs fabric (tests/softroce/guest_transport.py drives transport/).
transport_ready() {
	[[ -f $REPO/transport/fabric_verbs.py ]] || {
		echo "transport/fabric_verbs.py (the verbs fabric) is not in the staged repository yet"
		exit 77
	}
}

guest_transport() {
	transport_ready
	cd "$REPO" && PYTHONPATH=$REPO python3 tests/softroce/guest_transport.py "$1" --spec "$SPEC"
}

phase_transport_build() { guest_transport build; }
phase_transport_verbs() { guest_transport verbs; }
phase_transport_probe() { guest_transport probe; }
phase_transport_burn() { guest_transport burn; }
phase_transport_allreduce() { guest_transport allreduce; }
phase_transport_cmdring() { guest_transport cmdring; }

finish() {
	# Where packets went missing, if rxe had to retransmit.
	{ dmesg; ip -s -s link; nstat -az; cat /proc/net/softnet_stat; } >"$RESULTS/diagnostics.log" 2>&1
	sync
	tar -C "$RESULTS" -cf /dev/vdc . && sync
	say "done; powering off"
	echo o >/proc/sysrq-trigger
	sleep 30
}

main() {
	mountpoint -q /run || mount -t tmpfs tmpfs /run
	mount -t tmpfs tmpfs /tmp
	mkdir -p /dev/shm "$RESULTS" && mount -t tmpfs tmpfs /dev/shm
	hostname "softroce-r$RANK"
	modprobe -a virtio_net virtio_rng 2>/dev/null
	uname -a >"$RESULTS/boot.log"
	printf 'boot\tpass\t%s\tkernel %s up, rank %s\n' "$(cut -d' ' -f1 /proc/uptime)" \
		"$(uname -r)" "$RANK" >"$RESULTS/status.tsv"
	say "boot done ($(cut -d' ' -f1 /proc/uptime) s), rank $RANK ($(spec ports | tr '\n' ' ')) phases $PHASES"

	# Bounds are ~4x a quiet run's figures (TCG guests crawl when the host is busy) and add up
	# to 3840 s: within run.sh's bound on the guests, so a guest always reports, even when its
	# peer died.
	run_phase net 30 phase_net
	run_phase rxe 120 phase_rxe
	run_phase ping 90 phase_ping
	run_phase rc_pingpong 120 phase_rc_pingpong
	run_phase write_bw 120 phase_write_bw
	run_phase transport_build 480 phase_transport_build
	run_phase transport_verbs 180 phase_transport_verbs
	run_phase transport_probe 600 phase_transport_probe
	run_phase transport_burn 900 phase_transport_burn
	run_phase transport_allreduce 900 phase_transport_allreduce
	run_phase transport_cmdring 300 phase_transport_cmdring
	finish
}

main

#!/bin/bash
# PID 1 of a Soft-RoCE guest (the image's stub execs it from the staged repository disk).
# Brings up the one NIC and an rxe device on it, runs the lane's phases against the peer guest
# with a bound on every wait, records each phase in /results/status.tsv (phase, pass|fail|skip,
# seconds, detail) with its log beside it, writes /results as a tar onto the results disk
# (/dev/vdc) and powers off. Rank 0 is the server side of every client/server phase.
set -u
export PATH=/usr/sbin:/usr/bin:/sbin:/bin HOME=/root LANG=C.UTF-8 PYTHONDONTWRITEBYTECODE=1
REPO=/mnt/repo
RESULTS=/results

arg() { sed -n "s/.*\bsr\.$1=\([^ ]*\).*/\1/p" /proc/cmdline; }
RANK=$(arg rank)
ADDR=$(arg addr)
PEER=$(arg peer)
MTU=$(arg mtu)
PHASES=$(arg phases)
NIC=
ROLE=server
((RANK == 0)) || ROLE=client
# The phases run in child shells (under timeout): they see these.
export REPO RESULTS RANK ADDR PEER MTU ROLE

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

rxe_counters() {
	local f
	for f in /sys/class/infiniband/rxe0/ports/1/hw_counters/*; do
		[[ -r $f ]] && printf '%s=%s ' "${f##*/}" "$(cat "$f")"
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
	local nics
	nics=$(nics)
	# The guest must be on no network but the one cable.
	[[ $(wc -w <<<"$nics") == 1 ]] || { echo "expected exactly one NIC, found: $nics"; return 1; }
	ip link set lo up
	ip link set "$nics" mtu "$MTU" up
	ip addr add "$ADDR/24" dev "$nics"
	for _ in $(seq 50); do
		[[ $(cat "/sys/class/net/$nics/operstate") == up ]] && break
		sleep 0.2
	done
	ip -br addr
	ip route
	echo "$nics $ADDR/24 mtu $MTU $(cat "/sys/class/net/$nics/operstate")"
}

phase_rxe() {
	local gid expected a b c d
	modprobe -a ib_uverbs rdma_rxe
	rdma link add rxe0 type rxe netdev "$NIC"
	rdma link show
	ibv_devinfo -d rxe0 -v
	# GID index 1 is the RoCE v2 GID mapped from the NIC's IPv4 address.
	IFS=. read -r a b c d <<<"$ADDR"
	expected=$(printf '0000:0000:0000:0000:0000:ffff:%02x%02x:%02x%02x' "$a" "$b" "$c" "$d")
	for _ in $(seq 50); do
		gid=$(cat /sys/class/infiniband/rxe0/ports/1/gids/1 2>/dev/null)
		[[ $gid == "$expected" ]] && break
		sleep 0.2
	done
	[[ $gid == "$expected" ]] || { echo "GID 1 is '$gid', expected $expected"; return 1; }
	echo "rxe0 on $NIC, $(ibv_devinfo -d rxe0 | grep -m1 active_mtu | tr -s ' \t' ' '), gid[1] $(cat /sys/class/infiniband/rxe0/ports/1/gid_attrs/types/1) $gid"
}

phase_ping() {
	retry_until 60 ping -c 1 -W 2 "$PEER" || return 1
	ping -c 5 -i 0.2 -W 2 "$PEER" | tail -n 2 | tr '\n' ' '
	echo
}

# perftest tools print a table; the detail is the figure that matters.
phase_rc_pingpong() {
	local cmd=(ibv_rc_pingpong -d rxe0 -g 1 -n 200)
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
	local cmd=(ib_write_bw -d rxe0 -x 1 -p 18516 -s 65536 -n 1000 -F)
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
	cd "$REPO" && PYTHONPATH=$REPO python3 tests/softroce/guest_transport.py "$1" \
		--rank "$RANK" --addr "$ADDR" --peer "$PEER" --device rxe0
}

phase_transport_build() { guest_transport build; }
phase_transport_verbs() { guest_transport verbs; }
phase_transport_probe() { guest_transport probe; }
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
	printf 'boot\tpass\t%s\tkernel %s up, rank %s %s peer %s\n' "$(cut -d' ' -f1 /proc/uptime)" \
		"$(uname -r)" "$RANK" "$ADDR" "$PEER" >"$RESULTS/status.tsv"
	say "boot done ($(cut -d' ' -f1 /proc/uptime) s), rank $RANK $ADDR peer $PEER phases $PHASES"

	# Bounds are ~4x a quiet run's figures (TCG guests crawl when the host is busy) and add up
	# to 2100 s: within run.sh's bound on the guests, so a guest always reports, even when its
	# peer died.
	run_phase net 30 phase_net
	NIC=$(nics | head -n 1)
	export NIC
	run_phase rxe 60 phase_rxe
	run_phase ping 90 phase_ping
	run_phase rc_pingpong 120 phase_rc_pingpong
	run_phase write_bw 120 phase_write_bw
	run_phase transport_build 480 phase_transport_build
	run_phase transport_verbs 180 phase_transport_verbs
	run_phase transport_probe 300 phase_transport_probe
	run_phase transport_allreduce 420 phase_transport_allreduce
	run_phase transport_cmdring 300 phase_transport_cmdring
	finish
}

main

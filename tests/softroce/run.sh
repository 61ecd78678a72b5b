#!/usr/bin/env bash
# The Soft-RoCE lane: QEMU TCG guests running Debian's kernel with rdma_rxe, cabled as a ring (four
# guests, four cables; or a pair on one cable), run real verbs between them: perftest first, then
# the project's verbs fabric. Each cable end is a cage of two twins, as on a Spark: two NICs, two
# rxe devices, one unix-socket "cable" per twin (twin t to twin t); the first twin carries the
# port address, the second none (RDMA over its link-local GID), and the fabric stripes over both
# (tests/softroce/ring_specs.py lays the ring out). The host kernel has no RDMA and KVM guests
# hang on this machine, so the guests are software-emulated: slow, but a real RDMA stack.
#
#   tests/softroce/run.sh [all|deps|build|run]        (root; default: all)
#
# deps   installs the host packages in tests/softroce/requirements-apt.txt
# build  debootstraps the guest root and its ext4 image into $SOFTROCE_CACHE (reused when current)
# run    stages this checkout on its own disk, boots both guests, collects their results disks
#        and writes $SOFTROCE_OUT/summary.json; exit 0 only if no phase failed
#
# Environment (defaults in brackets):
#   SOFTROCE_CACHE    guest root, image and kernel [/var/cache/sparkring-softroce]
#   SOFTROCE_OUT      this run's disks, consoles, per-phase logs, summary.json [$SOFTROCE_CACHE/run]
#   SOFTROCE_TIMEOUT  wall-clock bound on the guests, seconds [4500]
#   SOFTROCE_MIRROR   Debian mirror for debootstrap [http://deb.debian.org/debian]
#   SOFTROCE_PHASES   comma list of guest phases to run (guest-init.sh names them) [all]
#   SOFTROCE_MTU      cable MTU [9000, the ring's; rxe then uses path MTU 4096]
#   SOFTROCE_RANKS    guests: 4 (a ring: the four-rank burn) or 2 (a pair on one cable) [4]
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(cd "$HERE/../.." && pwd)
CACHE=${SOFTROCE_CACHE:-/var/cache/sparkring-softroce}
OUT=${SOFTROCE_OUT:-$CACHE/run}
TIMEOUT=${SOFTROCE_TIMEOUT:-4500}
MIRROR=${SOFTROCE_MIRROR:-http://deb.debian.org/debian}
PHASES=${SOFTROCE_PHASES:-all}
MTU=${SOFTROCE_MTU:-9000}
RANKS=${SOFTROCE_RANKS:-4}
TWINS=2
SUITE=bookworm
STUB=/sbin/sparkring-softroce-init
INVOCATION="tests/softroce/run.sh ${*:-all}"

log() { printf '[softroce %s] %s\n' "$(date -u +%H:%M:%S)" "$*"; }
die() { log "ERROR: $*"; exit 1; }
packages() { grep -Ev '^\s*(#|$)' "$1"; }
newest() { printf '%s\n' "$@" | sort -V | tail -n 1; }

# Host phase timings, for summary.json.
declare -A HOST_SECONDS=()
timed() {
	local name=$1 start=$SECONDS
	shift
	"$@"
	HOST_SECONDS[$name]=$((SECONDS - start))
	log "$name: ${HOST_SECONDS[$name]} s"
}

require_root() { [[ $EUID -eq 0 ]] || die "the Soft-RoCE lane needs root (debootstrap, mkfs.ext4 -d); run it as root"; }

do_deps() {
	local missing=() p
	for p in $(packages "$HERE/requirements-apt.txt"); do
		dpkg-query -W -f='${Status}\n' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
	done
	if ((${#missing[@]})); then
		log "installing host packages: ${missing[*]}"
		apt-get update -qq
		DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}"
	fi
}

# debootstrap mounts /proc and /sys inside the target; a failed run can leave them behind, and
# `rm -rf` must never walk into them.
unmount_under() {
	local dir=$1 mnt
	for mnt in $(findmnt -rn -o TARGET | grep -F "$dir/" | sort -r); do
		umount -l "$mnt"
	done
}

# The guest's PID 1 lives in the repository (it changes with the lane); the image only holds
# this stub, which mounts the repository disk and hands over to it.
write_stub() {
	cat >"$1$STUB" <<'EOF'
#!/bin/sh
# Soft-RoCE guest bootstrap, baked into the image by tests/softroce/run.sh: mount the staged
# repository (second virtio disk) and hand over to its guest init.
mountpoint -q /proc || mount -t proc proc /proc
mountpoint -q /sys || mount -t sysfs sysfs /sys
mountpoint -q /dev || mount -t devtmpfs devtmpfs /dev
mkdir -p /mnt/repo
if mount -t ext4 /dev/vdb /mnt/repo && [ -x /mnt/repo/tests/softroce/guest-init.sh ]; then
	exec /mnt/repo/tests/softroce/guest-init.sh
fi
echo "SOFTROCE FATAL: no repository disk with tests/softroce/guest-init.sh on /dev/vdb"
echo o >/proc/sysrq-trigger
EOF
	chmod 0755 "$1$STUB"
}

build_root() {
	local key root=$CACHE/root
	key=$(cat "$HERE/guest-packages.txt" <(echo "$SUITE $MIRROR") | sha256sum | cut -d' ' -f1)
	if [[ -d $root && "$(cat "$CACHE/root.key" 2>/dev/null)" == "$key" ]]; then
		log "guest root: cached ($root)"
		return
	fi
	log "guest root: debootstrap $SUITE into $root.tmp (several minutes)"
	unmount_under "$root.tmp"
	rm -rf "$root.tmp"
	debootstrap --variant=minbase --include="$(packages "$HERE/guest-packages.txt" | paste -sd,)" \
		"$SUITE" "$root.tmp" "$MIRROR"
	if ! compgen -G "$root.tmp/boot/initrd.img-*" >/dev/null; then
		chroot "$root.tmp" update-initramfs -c -k all
	fi
	rm -f "$root.tmp"/var/cache/apt/archives/*.deb
	unmount_under "$root.tmp"
	unmount_under "$root"
	rm -rf "$root"
	mv "$root.tmp" "$root"
	echo "$key" >"$CACHE/root.key"
	rm -f "$CACHE/image.key"
}

build_image() {
	local key root=$CACHE/root
	write_stub "$root"
	key=$(cat "$CACHE/root.key" "$root$STUB" | sha256sum | cut -d' ' -f1)
	if [[ -f $CACHE/rootfs.img && "$(cat "$CACHE/image.key" 2>/dev/null)" == "$key" ]]; then
		log "guest image: cached ($CACHE/rootfs.img)"
		return
	fi
	log "guest image: mkfs.ext4 -d $root"
	rm -f "$CACHE/rootfs.img.tmp"
	mkfs.ext4 -q -F -L sr-root -d "$root" "$CACHE/rootfs.img.tmp" 3G
	cp "$(newest "$root"/boot/vmlinuz-*)" "$CACHE/vmlinuz"
	cp "$(newest "$root"/boot/initrd.img-*)" "$CACHE/initrd.img"
	mv "$CACHE/rootfs.img.tmp" "$CACHE/rootfs.img"
	echo "$key" >"$CACHE/image.key"
}

do_build() {
	require_root
	mkdir -p "$CACHE"
	timed guest_root build_root
	timed guest_image build_image
}

# The checkout as git sees it (tracked and untracked-but-not-ignored files: work in progress
# included, .venv and build outputs excluded) on its own ext4 disk, with each guest's ring spec.
stage_repo() {
	local stage=$OUT/repo
	mkdir -p "$stage"
	git -C "$REPO" ls-files -z --cached --others --exclude-standard |
		while IFS= read -r -d '' f; do [[ -e $REPO/$f ]] && printf '%s\0' "$f"; done |
		tar -C "$REPO" --null -T - -cf - | tar -C "$stage" -xf -
	python3 "$HERE/ring_specs.py" "$stage/.softroce" "$RANKS" "$TWINS"
	# Room for the staged files plus what the guests build there (sparse, so cheap).
	mkfs.ext4 -q -F -L sr-repo -d "$stage" "$OUT/repo.img" "$(($(du -sm "$stage" | cut -f1) + 512))M"
}

GUEST_PIDS=()
stop_guests() {
	local pid
	for pid in "${GUEST_PIDS[@]}"; do
		kill -0 "$pid" 2>/dev/null && kill "$pid" 2>/dev/null
	done
	return 0
}

# One guest: a NIC per twin of each of its ports, in the order its ring spec lists them (NIC k
# becomes eth<k>). Every twin of a cable is a unix socket its even end serves (a ring cable joins
# one even and one odd rank), so the even guests start first and the odd ones connect.
start_guest() {
	local rank=$1 nics=() k=0 cable twin role
	role=$( ((rank % 2 == 0)) && echo on || echo off)
	while read -r cable twin; do
		nics+=(-netdev "stream,id=nic$k,server=$role,addr.type=unix,addr.path=$OUT/cable$cable-$twin.sock"
			-device "virtio-net-pci,netdev=nic$k,mac=52:54:00:53:5$rank:0$k")
		k=$((k + 1))
	done < <(python3 "$HERE/ring_specs.py" --nics "$OUT/repo/.softroce/rank$rank.json")
	truncate -s 64M "$OUT/results-$rank.img"
	qemu-system-x86_64 -accel tcg -cpu max -m 1024 -smp 1 \
		-nodefaults -display none -no-reboot -serial "file:$OUT/console-$rank.log" \
		-kernel "$CACHE/vmlinuz" -initrd "$CACHE/initrd.img" \
		-append "root=/dev/vda rw console=ttyS0 net.ifnames=0 panic=1 init=$STUB sr.rank=$rank sr.mtu=$MTU sr.phases=$PHASES" \
		-drive "file=$CACHE/rootfs.img,if=virtio,format=raw,snapshot=on" \
		-drive "file=$OUT/repo.img,if=virtio,format=raw,snapshot=on" \
		-drive "file=$OUT/results-$rank.img,if=virtio,format=raw" \
		"${nics[@]}" \
		-device virtio-rng-pci \
		</dev/null >"$OUT/qemu-$rank.log" 2>&1 &
	GUEST_PIDS+=($!)
}

guests_running() {
	local pid
	for pid in "${GUEST_PIDS[@]}"; do kill -0 "$pid" 2>/dev/null && return 0; done
	return 1
}

run_guests() {
	local deadline=$((SECONDS + TIMEOUT)) i rank sock
	for ((rank = 0; rank < RANKS; rank += 2)); do start_guest "$rank"; done
	# The odd guests connect to the even ones' sockets: wait for every one (bounded).
	for sock in $(python3 "$HERE/ring_specs.py" --sockets "$OUT" "$RANKS" "$TWINS"); do
		for ((i = 0; i < 100; i++)); do
			[[ -S $sock ]] && break
			sleep 0.1
		done
		[[ -S $sock ]] || die "no guest opened $sock: $(cat "$OUT"/qemu-*.log)"
	done
	for ((rank = 1; rank < RANKS; rank += 2)); do start_guest "$rank"; done
	while guests_running; do
		if ((SECONDS >= deadline)); then
			log "guests still running after ${TIMEOUT} s: killing them"
			stop_guests
			break
		fi
		sleep 2
	done
	for i in "${!GUEST_PIDS[@]}"; do wait "${GUEST_PIDS[$i]}" || log "qemu $i exited with status $?"; done
}

collect_results() {
	local rank
	for ((rank = 0; rank < RANKS; rank++)); do
		mkdir -p "$OUT/rank$rank"
		if ! tar -C "$OUT/rank$rank" -xf "$OUT/results-$rank.img" 2>/dev/null; then
			log "rank $rank wrote no results; its console ends with:"
			tail -n 30 "$OUT/console-$rank.log" || true
		fi
	done
}

json_string() { local s=${1//\\/\\\\}; s=${s//\"/\\\"}; printf '"%s"' "${s//$'\t'/ }"; }

# summary.json: host timings plus every guest phase (name, status, seconds, detail) per rank.
write_summary() {
	local result=pass rank name status seconds detail first key sep=''
	{
		printf '{\n  "lane": "softroce",\n  "command": %s,\n  "mtu": %s,\n  "world": %s,\n  "twins": %s,\n  "host_seconds": {' \
			"$(json_string "$INVOCATION")" "$MTU" "$RANKS" "$TWINS"
		for key in "${!HOST_SECONDS[@]}"; do printf '%s"%s": %s' "$sep" "$key" "${HOST_SECONDS[$key]}"; sep=', '; done
		printf '},\n  "ranks": {'
		for ((rank = 0; rank < RANKS; rank++)); do
			printf '%s\n    "%s": [' "$( ((rank > 0)) && echo ,)" "$rank"
			first=1
			if [[ -f $OUT/rank$rank/status.tsv ]]; then
				while IFS=$'\t' read -r name status seconds detail; do
					((first)) || printf ','
					first=0
					printf '\n      {"phase": "%s", "status": "%s", "seconds": %s, "detail": %s}' \
						"$name" "$status" "$seconds" "$(json_string "$detail")"
					[[ $status == fail ]] && result=fail
				done <"$OUT/rank$rank/status.tsv"
			else
				result=fail
			fi
			printf ']'
		done
		printf '\n  },\n  "result": "%s"\n}\n' "$result"
	} >"$OUT/summary.json"
	[[ $result == pass ]]
}

print_results() {
	local rank
	for ((rank = 0; rank < RANKS; rank++)); do
		log "rank $rank phases (phase, status, seconds, detail):"
		column -t -s $'\t' "$OUT/rank$rank/status.tsv" 2>/dev/null || echo "  (none)"
	done
}

do_run() {
	require_root
	[[ -f $CACHE/rootfs.img && -f $CACHE/vmlinuz ]] || die "no guest image in $CACHE: run '$0 build' first"
	[[ $OUT == "$CACHE"/* ]] || [[ ! -e $OUT ]] || [[ -f $OUT/summary.json || -z "$(ls -A "$OUT")" ]] ||
		die "SOFTROCE_OUT=$OUT exists and is not a previous lane output: refusing to clear it"
	rm -rf "$OUT"
	mkdir -p "$OUT"
	trap stop_guests EXIT
	timed stage_repo stage_repo
	timed guests run_guests
	collect_results
	print_results
	if write_summary; then
		log "PASS: every phase passed or was skipped (summary: $OUT/summary.json)"
	else
		log "FAIL: see $OUT/summary.json, $OUT/rank*/ and $OUT/console-*.log"
		return 1
	fi
}

case ${1:-all} in
deps) do_deps ;;
build) do_build ;;
run) do_run ;;
all)
	require_root
	timed deps do_deps
	do_build
	do_run
	;;
*) die "usage: $0 [all|deps|build|run]" ;;
esac

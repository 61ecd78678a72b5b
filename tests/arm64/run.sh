#!/usr/bin/env bash
# The aarch64 lane (`make arm64`, opt-in like `make softroce`): SparkRing's native code and unit
# tests on the CPU a Spark has, emulated. Debian's qemu-user-static runs an arm64 Debian 12 root
# through binfmt_misc; inside it (chroot, a copy of this tree) the project's own build code
# (transport/_native.py, -Werror) compiles the engine with the root's gcc, and pytest runs
# tests/unit/transport (golden vectors from x86 included), the overlay and SparkCache unit tests
# that need no vLLM, and tests/arm64. On the host, the aarch64 cross gcc compiles the engine and
# the progress thread at -O3 -Wall -Wextra -Werror, and the GPU producer is tried with nvcc.
#
#   tests/arm64/run.sh [all|deps|root|cross|gpu|test]     (root; default: all)
#
# The machine is left as the lane found it, whatever happens (an EXIT trap): every binfmt_misc
# entry that was not registered before the lane is removed again, binfmt_misc is unmounted if the
# lane mounted it, and every mount under the root (proc, dev) is undone.
#
# Environment (defaults in brackets):
#   SPARKRING_ARM64_CACHE  the root and its keys, the GPU cross build [/var/cache/sparkring-arm64]
#   ARM64_PYTEST_ARGS      extra pytest arguments (e.g. -k golden) [none]
# The Debian mirror and suite are images/lock.json's sim_base (the sim image's, by content).
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(cd "$HERE/../.." && pwd)
CACHE=${SPARKRING_ARM64_CACHE:-/var/cache/sparkring-arm64}
ROOT=$CACHE/root
BINFMT=/proc/sys/fs/binfmt_misc
HOST_PACKAGES=(qemu-user-static binfmt-support debootstrap gcc-aarch64-linux-gnu libc6-dev-arm64-cross
	g++-aarch64-linux-gnu)
ROOT_PACKAGES=python3,python3-venv,gcc,libc6-dev
TESTS=(tests/unit/transport tests/unit/overlay tests/unit/sparkcache tests/arm64)
# pip for the host-side downloads: the project's venv, else the system's.
if [[ -x $REPO/.venv/bin/pip ]]; then PIP=("$REPO/.venv/bin/pip"); else PIP=(python3 -m pip); fi

log() { printf '[arm64 %s] %s\n' "$(date -u +%H:%M:%S)" "$*"; }
die() { log "ERROR: $*"; exit 1; }
[[ $EUID -eq 0 ]] || die "the arm64 lane needs root (debootstrap, chroot, binfmt_misc); run it as root"

lock_base() { python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['sim_base'][sys.argv[2]])" \
	"$REPO/images/lock.json" "$1"; }
MIRROR=$(lock_base mirror)
SUITE=$(lock_base suite)

# -- leave the machine as it was ------------------------------------------------------------------
# binfmt_misc is global to the machine: note what is there before anything (apt included) runs.
BINFMT_WAS_MOUNTED=0 BINFMT_BEFORE=" "
if mountpoint -q "$BINFMT"; then
	BINFMT_WAS_MOUNTED=1 BINFMT_BEFORE=" $(ls "$BINFMT" | tr '\n' ' ')"
fi

unmount_under() {
	local dir=$1 mnt
	for mnt in $(findmnt -rn -o TARGET | grep -F "$dir/" | sort -r); do
		umount -l "$mnt"
	done
}

restore() {
	local status=$? entry
	unmount_under "$ROOT"
	unmount_under "$ROOT.tmp"
	if mountpoint -q "$BINFMT"; then
		for entry in "$BINFMT"/*; do
			case $(basename "$entry") in register | status) continue ;; esac
			[[ $BINFMT_BEFORE == *" $(basename "$entry") "* ]] && continue
			echo -1 >"$entry" && log "binfmt: removed $(basename "$entry") (the lane registered it)"
		done
		if ((!BINFMT_WAS_MOUNTED)); then umount "$BINFMT" && log "binfmt: unmounted $BINFMT"; fi
	fi
	exit "$status"
}
trap restore EXIT

# -- phases ----------------------------------------------------------------------------------------
do_deps() {
	local missing=() p
	for p in "${HOST_PACKAGES[@]}"; do
		dpkg-query -W -f='${Status}\n' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
	done
	if ((${#missing[@]})); then
		log "installing host packages: ${missing[*]}"
		apt-get update -qq
		DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}"
	fi
}

binfmt_up() {
	mountpoint -q "$BINFMT" || { mount -t binfmt_misc binfmt_misc "$BINFMT" && log "binfmt: mounted $BINFMT"; }
	if [[ ! -e $BINFMT/qemu-aarch64 ]]; then
		update-binfmts --enable qemu-aarch64 && log "binfmt: registered qemu-aarch64"
	fi
	grep -qx enabled "$BINFMT/qemu-aarch64" || die "binfmt entry qemu-aarch64 is disabled: enable it (echo 1 > $BINFMT/qemu-aarch64)"
}

# The root is cached in two layers, each keyed by what it is made of: the debootstrapped base
# (suite, mirror, packages; minutes under emulation) and the lane's venv in it (the wheel pins).
base_key() { echo "$SUITE $MIRROR $ROOT_PACKAGES" | sha256sum | cut -d' ' -f1; }
venv_key() { sha256sum <"$HERE/requirements.txt" | cut -d' ' -f1; }

do_root() {
	local key
	key=$(base_key)
	if [[ -d $ROOT && "$(cat "$CACHE/root.key" 2>/dev/null)" == "$key" ]]; then
		log "root: base cached ($ROOT, key ${key:0:12})"
	else
		binfmt_up
		mkdir -p "$CACHE"
		log "root: debootstrap --arch arm64 $SUITE from $MIRROR into $ROOT.tmp (minutes under emulation)"
		unmount_under "$ROOT.tmp"
		rm -rf "$ROOT.tmp"
		debootstrap --arch arm64 --variant=minbase --include="$ROOT_PACKAGES" "$SUITE" "$ROOT.tmp" "$MIRROR" \
			>"$CACHE/debootstrap.log" 2>&1 || { tail -n 30 "$CACHE/debootstrap.log"; die "debootstrap failed"; }
		rm -f "$ROOT.tmp"/var/cache/apt/archives/*.deb
		unmount_under "$ROOT.tmp"
		unmount_under "$ROOT"
		rm -rf "$ROOT" "$CACHE/venv.key"
		mv "$ROOT.tmp" "$ROOT"
		echo "$key" >"$CACHE/root.key"
		log "root: base built ($(du -sh "$ROOT" | cut -f1))"
	fi
	key=$(venv_key)
	if [[ -x $ROOT/opt/lane/bin/python && "$(cat "$CACHE/venv.key" 2>/dev/null)" == "$key" ]]; then
		log "root: venv cached (key ${key:0:12})"
		return
	fi
	binfmt_up
	rm -rf "$ROOT/opt/lane" "$CACHE/venv.key"
	chroot "$ROOT" python3 -m venv --without-pip /opt/lane
	local site
	site=$(chroot "$ROOT" /opt/lane/bin/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
	# pip runs natively on the host (pip under emulation takes minutes): manylinux aarch64 wheels
	# for the root's CPython 3.11, unpacked into the venv's site-packages.
	log "root: venv /opt/lane: $(grep -Evc '^\s*(#|$)' "$HERE/requirements.txt") pinned wheels for manylinux aarch64, installed by the host's pip"
	"${PIP[@]}" install -q --target "$ROOT$site" --only-binary=:all: --implementation cp --python-version 3.11 \
		--platform manylinux_2_28_aarch64 --platform manylinux_2_17_aarch64 --platform manylinux2014_aarch64 \
		-r "$HERE/requirements.txt"
	echo "$key" >"$CACHE/venv.key"
}

# The compile check a Spark's build stage would hit first, on the host with the cross compiler.
do_cross() {
	local src out=$CACHE/cross
	mkdir -p "$out"
	for src in sr_engine.c sr_progress.c; do
		aarch64-linux-gnu-gcc -O3 -std=gnu11 -fPIC -shared -Wall -Wextra -Werror -I "$REPO/transport/csrc" \
			-o "$out/${src%.c}.so" "$REPO/transport/csrc/$src" -lpthread
		log "cross: aarch64-linux-gnu-gcc -O3 -Wall -Wextra -Werror $src: ok"
	done
}

# The GPU producer for GB10 (aarch64, sm_121), cross-compiled by the host's nvcc if it can be.
# Where it cannot be tried (no nvcc here), the lane says why and goes on; a failed build fails it.
do_gpu() {
	local status=0
	"$HERE/gpu_cross.sh" "$CACHE/gpu" || status=$?
	if ((status == 2)); then
		log "gpu: sr_gpu.cu NOT built for aarch64 (the reason is above)"
	elif ((status)); then
		die "gpu: building sr_gpu.cu for aarch64 + sm_121 failed"
	fi
}

do_test() {
	binfmt_up
	[[ -x $ROOT/opt/lane/bin/python ]] || die "no lane root in $ROOT: run tests/arm64/run.sh root first"
	local tree=$ROOT/work/sparkring
	log "test: copying this tree into the root"
	rm -rf "$tree" "$ROOT/tmp/sparkring-transport"
	mkdir -p "$tree"
	if git -C "$REPO" rev-parse --is-inside-work-tree >/dev/null 2>&1; then
		git -C "$REPO" ls-files -z --cached --others --exclude-standard |
			(cd "$REPO" && xargs -0 tar --no-recursion --ignore-failed-read -cf - 2>/dev/null) | tar -xf - -C "$tree"
	else
		tar -C "$REPO" --exclude=./.venv --exclude=./.venv-vllm --exclude=./.cache --exclude=./.git -cf - . |
			tar -xf - -C "$tree"
	fi
	mount -t proc proc "$ROOT/proc"
	mount --rbind /dev "$ROOT/dev"
	mount --make-rslave "$ROOT/dev" # unmounting it later must never reach the host's /dev
	log "test: pytest ${TESTS[*]} in the arm64 root ($(chroot "$ROOT" uname -m), emulated: timings mean nothing)"
	# shellcheck disable=SC2086 # ARM64_PYTEST_ARGS is a list of arguments
	chroot "$ROOT" /usr/bin/env -i PATH=/opt/lane/bin:/usr/bin:/bin HOME=/root LANG=C.UTF-8 \
		SPARKRING_ARM64_LANE=1 SPARKRING_TRANSPORT_CACHE=/tmp/sparkring-transport CC=gcc \
		PYTHONPATH=/work/sparkring/tests/arm64 \
		sh -c "cd /work/sparkring && exec python -m pytest -p no:cacheprovider -p lane_plugin -ra ${TESTS[*]} ${ARM64_PYTEST_ARGS:-}"
}

case ${1:-all} in
deps) do_deps ;;
root) do_deps && do_root ;;
cross) do_cross ;;
gpu) do_gpu ;;
test) do_test ;;
all) do_deps && do_cross && do_gpu && do_root && do_test ;;
*) die "unknown phase ${1}: all, deps, root, cross, gpu or test" ;;
esac

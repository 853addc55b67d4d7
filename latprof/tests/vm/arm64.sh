#!/usr/bin/env bash
# Boots a Debian arm64 stock kernel under qemu-system-aarch64 (software emulation) and runs a
# script in it: the arm64 twin of ../shared/vm/run.sh, with the same arguments and the same
# guest (busybox tools, tracefs, debugfs, a scratch ext4 disk on /mnt), so tests/common/vm.rs
# boots either the same way.
#
#   arm64.sh [--kernel debian-12|debian-13] [--smp N] [--mem MB] [--append ARGS] [--bin FILE]...
#            [--file FILE]... SCRIPT
#
# --kernel picks Debian's own binary package (not a rebuild), pinned by version and checksum:
#   debian-12: linux-image-6.1.0-57-arm64-unsigned 6.1.192-3 (bookworm-security), Debian 12's
#              kernel, the same release as the x86 guests' debian-6.1;
#   debian-13: linux-image-6.12.117+deb13-arm64-unsigned 6.12.117-1 (trixie), Debian 13's.
# Each comes with the busybox-static of its own release, fetched through a private apt
# configuration (that release's archive for arm64, nothing else; the host's sources, lists and
# architectures are left alone) and unpacked once into /var/cache/latprof-tests/arm64/KERNEL
# (vmlinuz, the modules the guest needs, their load order from the package's modules.dep, the
# config, busybox). --bin copies a static arm64 executable into the guest's /bin (nothing else:
# the host's libraries are x86-64's); --file copies a file into /work.
#
# -M virt -cpu max: every feature qemu emulates, pointer authentication included
# (pauth-impdef: qemu's own cheap signing algorithm instead of QARMA, which the guest cannot tell
# apart but costs several times more to emulate). Expect about 20 s to boot.
set -euo pipefail
smp=2 mem=1024 append="" bins=() files=() kernel=debian-12
while [ $# -gt 1 ]; do
  case "$1" in
    --smp) smp=$2; shift 2 ;; --mem) mem=$2; shift 2 ;; --append) append=$2; shift 2 ;;
    --bin) bins+=("$2"); shift 2 ;; --file) files+=("$2"); shift 2 ;; --kernel) kernel=$2; shift 2 ;;
    *) break ;;
  esac
done
[ $# -eq 1 ] || { echo "usage: arm64.sh [--kernel debian-12|debian-13] [--smp N] [--mem MB] [--append ARGS] [--bin FILE]... [--file FILE]... SCRIPT" >&2; exit 2; }
script=$1
case "$kernel" in
  debian-12) suite=bookworm security=bookworm-security abi=6.1.0-57-arm64 version=6.1.192-3
             sha=b19fb23a7313b6e345c7ef7aa8d2ce44381d32111403b86040bdada12da8c379 ;;
  debian-13) suite=trixie security=trixie-security abi=6.12.117+deb13-arm64 version=6.12.117-1
             sha=cc5be026b4113d670d4355f719b7a0103297a36e59717e45a89d0fbd985af041 ;;
  *) echo "arm64.sh: no kernel '$kernel' (have: debian-12 debian-13)" >&2; exit 2 ;;
esac
# virtio over MMIO (qemu's virt board) for the scratch disk, ext4 for it.
modules="virtio_mmio virtio_blk ext4"

need=()
command -v qemu-system-aarch64 >/dev/null || need+=(qemu-system-arm)
command -v cpio >/dev/null || need+=(cpio)
command -v mke2fs >/dev/null || need+=(e2fsprogs)
command -v depmod >/dev/null || need+=(kmod)
command -v xz >/dev/null || need+=(xz-utils)
command -v file >/dev/null || need+=(file)
if [ ${#need[@]} -gt 0 ]; then
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi

cache=/var/cache/latprof-tests/arm64/$kernel
fetch() {
  local tmp; tmp=$(mktemp -d /tmp/latprof-arm64.XXXXXX)
  chmod 755 "$tmp"
  (
    cd "$tmp"
    mkdir -p apt/lists/partial apt/cache/archives/partial
    printf 'deb http://deb.debian.org/debian %s main\ndeb http://deb.debian.org/debian-security %s main\n' \
      "$suite" "$security" > apt/sources.list
    a=(-o Dir::Etc::sourcelist="$tmp/apt/sources.list" -o Dir::Etc::sourceparts=/dev/null
       -o Dir::State::Lists="$tmp/apt/lists" -o Dir::Cache="$tmp/apt/cache"
       -o APT::Architecture=arm64 -o APT::Architectures=arm64 -o APT::Sandbox::User=root)
    apt-get "${a[@]}" update -qq
    pkg=linux-image-$abi-unsigned
    apt-get "${a[@]}" download "$pkg=$version" busybox-static >/dev/null
    echo "$sha  ${pkg}_${version}_arm64.deb" | sha256sum -c --quiet -
    dpkg-deb -x "${pkg}_${version}_arm64.deb" x
    dpkg-deb -x busybox-static_*_arm64.deb bb
    mkdir -p out/modules
    cp "x/boot/vmlinuz-$abi" out/vmlinuz
    cp "x/boot/config-$abi" out/config
    # /bin/busybox in Debian 12's package, /usr/bin/busybox in 13's (merged /usr).
    for b in bb/bin/busybox bb/usr/bin/busybox; do [ ! -f "$b" ] || cp "$b" out/busybox; done
    [ "$(head -c 4 out/busybox)" = "$(printf '\177ELF')" ] || { echo "arm64.sh: no busybox in busybox-static" >&2; exit 1; }
    # /lib/modules in Debian 12's package, /usr/lib/modules in 13's.
    mods=x; [ -d "x/usr/lib/modules/$abi" ] && mods=x/usr
    depmod -b "$mods" "$abi"
    # Each wanted module after the ones it needs, as modules.dep lists them.
    order=()
    add() {
      local path deps d
      path=$(awk -F: -v m="$1" '$1 ~ ("(^|/)" m "\\.ko(\\.xz)?$") { print $1; exit }' \
        "$mods/lib/modules/$abi/modules.dep")
      if [ -z "$path" ]; then
        # Built into the kernel (Debian 13's virtio_mmio): nothing to load.
        grep -q "/$1.ko\$" "$mods/lib/modules/$abi/modules.builtin" && return
        echo "arm64.sh: $1 is not in $pkg" >&2; exit 1
      fi
      deps=$(awk -F: -v p="$path" '$1 == p { print $2 }' "$mods/lib/modules/$abi/modules.dep")
      for d in $deps; do d=${d##*/}; add "${d%%.ko*}"; done
      case " ${order[*]} " in *" $1 "*) return ;; esac
      order+=("$1")
      case "$path" in
        *.xz) xz -dc "$mods/lib/modules/$abi/$path" > "out/modules/$1.ko" ;;
        *) cp "$mods/lib/modules/$abi/$path" "out/modules/$1.ko" ;;
      esac
    }
    for m in $modules crc32c_generic; do add "$m"; done
    printf '%s\n' "${order[@]}" > out/modules/load-order
  )
  mkdir -p "$(dirname "$cache")"
  rm -rf "$cache.new"; mv "$tmp/out" "$cache.new"; rm -rf "$cache"; mv "$cache.new" "$cache"
  rm -rf "$tmp"
}
mkdir -p "$(dirname "$cache")"
exec 9> "$(dirname "$cache")/.lock"
flock 9
if [ ! -f "$cache/modules/load-order" ]; then fetch; fi
flock -u 9

work=$(mktemp -d /tmp/latprof-vm.XXXXXX); trap 'rm -rf "$work"' EXIT
root=$work/root; mkdir -p "$root"/{bin,sbin,proc,sys,dev,tmp,mnt,work,etc,boot,lib/modules}
cp "$cache/busybox" "$root/bin/busybox"
for b in "${bins[@]}"; do
  file -L "$b" | grep -Eq 'ARM aarch64.*(statically|static-pie) linked' \
    || { echo "arm64.sh: $b is not a static arm64 executable: $(file -L "$b")" >&2; exit 2; }
  cp "$b" "$root/bin/"
done
for f in "${files[@]}"; do cp "$f" "$root/work/"; done
cp "$script" "$root/work/script.sh"; chmod +x "$root/work/script.sh"
cp "$cache"/modules/* "$root/lib/modules/"
cp "$cache/config" "$root/boot/config"
cat > "$root/init" <<'INIT'
#!/bin/busybox sh
/bin/busybox --install -s /bin
export PATH=/bin:/sbin:/usr/bin:/usr/sbin
mount -t proc proc /proc; mount -t sysfs sysfs /sys; mount -t devtmpfs devtmpfs /dev 2>/dev/null
mv /boot/config "/boot/config-$(uname -r)"
for m in $(cat /lib/modules/load-order); do insmod /lib/modules/$m.ko || echo "run.sh-init: insmod $m failed"; done
i=0; while [ ! -b /dev/vda ] && [ $i -lt 100 ]; do usleep 100000; i=$((i+1)); done
mount -t tmpfs tmpfs /tmp; mount -t debugfs debugfs /sys/kernel/debug 2>/dev/null
mount -t tracefs tracefs /sys/kernel/tracing 2>/dev/null
if [ -b /dev/vda ]; then mount -t ext4 /dev/vda /mnt || echo "run.sh-init: mounting the scratch disk failed"; fi
cd /work
echo "VM-SCRIPT-BEGIN"
/work/script.sh; rc=$?
echo "VM-SCRIPT-END rc=$rc"
sync; poweroff -f
INIT
chmod +x "$root/init"
(cd "$root" && find . | cpio -o -H newc --quiet | gzip -1 > "$work/initrd.gz")
truncate -s 128M "$work/disk.img"
mke2fs -q -t ext4 -F "$work/disk.img"
timeout 1500 qemu-system-aarch64 -M virt -cpu max,pauth-impdef=on -accel tcg,thread=multi \
  -smp "$smp" -m "$mem" -no-reboot -nodefaults -display none -serial stdio \
  -kernel "$cache/vmlinuz" -initrd "$work/initrd.gz" \
  -drive "file=$work/disk.img,if=none,id=scratch,format=raw,cache=none,aio=threads" \
  -device virtio-blk-device,drive=scratch \
  -append "console=ttyAMA0 panic=-1 quiet loglevel=3 $append" </dev/null > "$work/console.log" 2>&1 || true
tr -d '\r' < "$work/console.log" | grep '^run.sh-init:' >&2 || true
sed -n '/^VM-SCRIPT-BEGIN/,/^VM-SCRIPT-END/p' "$work/console.log" | tr -d '\r' | sed '1d;$d'
rc=$(tr -d '\r' < "$work/console.log" | sed -n 's/^VM-SCRIPT-END rc=//p')
[ -n "$rc" ] || { echo "run.sh: the guest did not finish the script; console tail:" >&2; tail -20 "$work/console.log" >&2; exit 1; }
exit "$rc"

#!/bin/sh
# /init of the `cargo xtask kernels` guest (busybox ash). Brings the guest up
# like a fresh host (no bpffs unless asked), runs /guest.sh, powers off.
# Lines starting with "STALLTRACE-MATRIX " are read by the host.
export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin HOME=/root TERM=dumb
M() { echo "STALLTRACE-MATRIX $*"; }
up() { cut -d' ' -f1 /proc/uptime; }

mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev
mkdir -p /dev/pts /dev/shm
mount -t devpts devpts /dev/pts
mount -t tmpfs tmpfs /dev/shm
mount -t tmpfs tmpfs /tmp
mount -t tmpfs tmpfs /run
mount -t cgroup2 cgroup2 /sys/fs/cgroup
# tracefs and debugfs as systemd mounts them; absent on some configs.
mount -t tracefs tracefs /sys/kernel/tracing 2>/dev/null
mount -t debugfs debugfs /sys/kernel/debug 2>/dev/null
mount -t securityfs securityfs /sys/kernel/security 2>/dev/null
@BPFFS@
mkdir -p /run/netns
# Disks by serial (NVMe controllers may probe in either order): st0 is the
# checks' raw test disk, st1 an ext4 the host made for /var/tmp.
for c in /sys/class/nvme/nvme*; do
    case "$(tr -d ' ' < "$c/serial")" in
    st0) STALLTRACE_TEST_DISK=/dev/$(basename "$c")n1 ;;
    st1) mount -t ext4 "/dev/$(basename "$c")n1" /var/tmp || M problem "cannot mount /var/tmp" ;;
    esac
done
export STALLTRACE_TEST_DISK
M boot "$(up)" "$(uname -r)"

ip link set lo up
# Host kmod (30) first offers a compressed module to finit_module, which the
# kernel refuses with "Invalid ELF header magic" before kmod decompresses it
# itself; hide that error-level noise (3) while loading.
echo 3 > /proc/sys/kernel/printk
for m in @MODULES@; do
    modprobe "$m" || M module-missing "$m"
done
# Kernel messages at warning and above reach the console; keep them (lockups,
# verifier splats) but not the info chatter of module loads.
echo 4 > /proc/sys/kernel/printk
M ready "$(up)"

cd /tmp
sh /guest.sh
M exit "$?" "$(up)"
sync
echo o > /proc/sysrq-trigger
poweroff -f
while :; do sleep 1; done

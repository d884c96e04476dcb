#!/bin/sh
# Runs this package's tests (or benchmarks: pass go test flags) in a QEMU
# guest with Debian's kernel, for hosts whose kernel lacks CONFIG_XFS_QUOTA
# (where the tests skip). Needs root, qemu-system-x86, busybox-static, cpio
# from busybox; downloads linux-image-<ver>-amd64 with apt-get download.
# The guest sees the host's / read-only over 9p, /mnt is a tmpfs TMPDIR.
#   internal/storage/upper/xfs/testdata/qemu-test.sh -test.v -test.bench=.
set -eu
pkg=$(cd "$(dirname "$0")/.." && pwd)
work=${WORK:-/tmp/corral-quota-qemu}
mkdir -p "$work" && cd "$work"
kpkg=$(apt-cache depends linux-image-amd64 | sed -n 's/.*Depends: \(linux-image-.*\)/\1/p' | head -1)
[ -d kroot ] || { apt-get download "$kpkg" && dpkg-deb -x "$kpkg"_*.deb kroot; }
kver=$(ls kroot/lib/modules | head -1)
mods=kroot/lib/modules/$kver
rm -rf initrd && mkdir -p initrd/bin initrd/mod initrd/host initrd/proc initrd/sys initrd/dev
cp "$(command -v busybox)" initrd/bin/
for a in sh mount insmod chroot poweroff cat; do ln -sf busybox initrd/bin/$a; done
for m in crc32c_generic virtio_ring virtio virtio_pci_legacy_dev virtio_pci_modern_dev virtio_pci \
	9pnet 9pnet_virtio fscache netfs 9p libcrc32c xfs loop overlay; do
	cp "$(find "$mods" -name "$m.ko" | head -1)" initrd/mod/ && echo "$m.ko"
done > initrd/mod/order
cat > initrd/init <<'INIT'
#!/bin/sh
mount -t proc proc /proc; mount -t sysfs sys /sys; mount -t devtmpfs dev /dev
for pass in 1 2 3; do for m in $(cat /mod/order); do insmod /mod/$m 2>/dev/null; done; done
mount -t 9p -o trans=virtio,version=9p2000.L,ro host /host
mount -t proc proc /host/proc; mount -t sysfs sys /host/sys; mount -t devtmpfs dev /host/dev
mount -t tmpfs -o size=3g tmp /host/mnt
chroot /host /bin/sh -c "cd $(cat /workdir) && TMPDIR=/mnt ./quota.test $(cat /args)"
echo "guest exit $?"
poweroff -f
INIT
chmod +x initrd/init
echo "$work" > initrd/workdir && echo "$*" > initrd/args
(cd "$pkg" && go test -c -o "$work/quota.test" .)
(cd initrd && find . | busybox cpio -o -H newc 2>/dev/null | gzip -1 > ../initrd.gz)
exec qemu-system-x86_64 -M q35 -accel tcg -m 3G -smp 2 -nographic -no-reboot \
	-kernel kroot/boot/vmlinuz-"$kver" -initrd initrd.gz -append "console=ttyS0 quiet panic=-1" \
	-virtfs local,path=/,mount_tag=host,security_model=none,readonly=on,multidevs=remap

package userns

import (
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"
)

// nsProcess starts a process in a new user namespace mapped to r and
// returns its namespace.
func nsProcess(t *testing.T, r Range) *os.File {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("skip: needs root")
	}
	cmd := exec.Command("/bin/sleep", "60")
	idmap := []syscall.SysProcIDMap{{ContainerID: 0, HostID: int(r.Host), Size: int(r.Size)}}
	cmd.SysProcAttr = &syscall.SysProcAttr{Cloneflags: unix.CLONE_NEWUSER, UidMappings: idmap, GidMappings: idmap}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	ns, err := OpenNS(cmd.Process.Pid)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ns.Close() })
	return ns
}

func TestOverlayOfIdmappedDirs(t *testing.T) {
	r := At(7)
	ns := nsProcess(t, r)
	dir := t.TempDir()
	for _, d := range []string{"lower", "layer/upper", "layer/work", "mnt"} {
		if err := os.MkdirAll(filepath.Join(dir, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(dir, "lower/a"), []byte("a"), 0o644); err != nil {
		t.Fatal(err)
	}
	lower, err := IdmapTree(filepath.Join(dir, "lower"), ns, unix.MOUNT_ATTR_RDONLY)
	if err != nil {
		t.Fatal(err)
	}
	defer lower.Close()
	base, err := IdmapTree(filepath.Join(dir, "layer"), ns, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer base.Close()
	open := func(name string) *os.File {
		fd, err := unix.Openat(int(base.Fd()), name, unix.O_PATH|unix.O_DIRECTORY, 0)
		if err != nil {
			t.Fatal(err)
		}
		return os.NewFile(uintptr(fd), name)
	}
	ovl, err := Overlay([]*os.File{lower}, open("upper"), open("work"), r)
	if err != nil {
		t.Fatal(err)
	}
	defer ovl.Close()
	mnt := filepath.Join(dir, "mnt")
	if err := unix.MoveMount(int(ovl.Fd()), "", unix.AT_FDCWD, mnt, unix.MOVE_MOUNT_F_EMPTY_PATH); err != nil {
		t.Fatal(err)
	}
	defer unix.Unmount(mnt, unix.MNT_DETACH)
	var st unix.Stat_t
	if err := unix.Stat(filepath.Join(mnt, "a"), &st); err != nil {
		t.Fatal(err)
	}
	if st.Uid != r.Host {
		t.Errorf("lower file owned by %d through the overlay, want the range's root %d", st.Uid, r.Host)
	}
	err = AsRoot(r, func() error { return os.WriteFile(filepath.Join(mnt, "new"), []byte("n"), 0o644) })
	if err != nil {
		t.Fatal(err)
	}
	if err := unix.Stat(filepath.Join(dir, "layer/upper/new"), &st); err != nil {
		t.Fatal(err)
	}
	if st.Uid != 0 {
		t.Errorf("new file owned by %d on disk, want 0 (idmapped upper)", st.Uid)
	}
}

package mountinfo

import (
	"strings"
	"testing"
)

func TestParse(t *testing.T) {
	const in = `22 1 0:21 / /sys rw,nosuid - sysfs sysfs rw
41 31 0:38 / /sys/fs/cgroup/unified rw,relatime shared:9 - cgroup2 cgroup2 rw,nsdelegate,favordynmods
90 22 7:0 / /tmp/my\040dir rw master:1 - xfs /dev/loop0 rw,prjquota
garbage line
`
	ms, err := parse(strings.NewReader(in))
	if err != nil {
		t.Fatal(err)
	}
	if len(ms) != 3 {
		t.Fatalf("parsed %d mounts, want 3: %+v", len(ms), ms)
	}
	if m := ms[1]; m.MountPoint != "/sys/fs/cgroup/unified" || m.FSType != "cgroup2" || !m.HasSuperOption("favordynmods") || m.HasSuperOption("rw,") {
		t.Errorf("cgroup2 line: %+v", m)
	}
	if m := ms[2]; m.MountPoint != "/tmp/my dir" || m.Source != "/dev/loop0" || !m.HasSuperOption("prjquota") {
		t.Errorf("escaped line: %+v", m)
	}
}

func TestReadSeesRoot(t *testing.T) {
	ms, err := Read()
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range ms {
		if m.MountPoint == "/" {
			return
		}
	}
	t.Errorf("no / among %d mounts", len(ms))
}

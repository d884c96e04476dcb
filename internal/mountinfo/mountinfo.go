// Package mountinfo reads /proc/self/mountinfo: the one parser of it in
// corral (cgroup detection, the disk and layer stores, tests). It imports
// nothing from corral.
package mountinfo

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"slices"
	"strconv"
	"strings"
)

// Mount is one line of mountinfo.
type Mount struct {
	MountPoint string
	FSType     string
	Source     string
	// SuperOptions are the per-superblock options (after the "-").
	SuperOptions []string
}

// HasSuperOption reports whether the superblock has option o.
func (m Mount) HasSuperOption(o string) bool { return slices.Contains(m.SuperOptions, o) }

// Read returns this mount namespace's mounts, in mountinfo order (a later
// mount at the same point is on top).
func Read() ([]Mount, error) {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return nil, fmt.Errorf("read mountinfo: %w", err)
	}
	defer f.Close()
	return parse(f)
}

func parse(r io.Reader) ([]Mount, error) {
	var out []Mount
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 64<<10), 1<<20)
	for sc.Scan() {
		if m, ok := parseLine(sc.Text()); ok {
			out = append(out, m)
		}
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("read mountinfo: %w", err)
	}
	return out, nil
}

// parseLine reads "id parent maj:min root mountpoint opts [optional...] -
// fstype source superopts".
func parseLine(line string) (Mount, bool) {
	fields := strings.Fields(line)
	for i, f := range fields {
		if f == "-" && i >= 6 && i+3 < len(fields) {
			return Mount{
				MountPoint:   unescape(fields[4]),
				FSType:       fields[i+1],
				Source:       unescape(fields[i+2]),
				SuperOptions: strings.Split(fields[i+3], ","),
			}, true
		}
	}
	return Mount{}, false
}

// unescape undoes mountinfo's \ooo escapes (space, tab, newline, backslash).
func unescape(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+4 <= len(s) {
			if v, err := strconv.ParseUint(s[i+1:i+4], 8, 8); err == nil {
				b.WriteByte(byte(v))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

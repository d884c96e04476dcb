package initproc

import (
	"bufio"
	"fmt"
	"os"
	"strconv"
	"strings"
	"syscall"

	"github.com/corral-dev/corral/internal/runtime/initproto"
)

// lookupUser turns "name", "uid" or "uid:gid" into credentials, reading the
// sandbox's own /etc/passwd and /etc/group. "" means root.
func lookupUser(user string) (*syscall.Credential, error) {
	if user == "" {
		user = "0"
	}
	name, group, hasGroup := strings.Cut(user, ":")
	if hasGroup {
		// "uid:gid", both numeric (the node's default "0:0"): no lookup
		// and no supplementary groups, so an exec reads no file of the
		// sandbox first.
		uid, uerr := strconv.ParseUint(name, 10, 32)
		gid, gerr := strconv.ParseUint(group, 10, 32)
		if uerr == nil && gerr == nil {
			return &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid), Groups: []uint32{}}, nil
		}
	}
	cred := &syscall.Credential{}
	uid, err := strconv.ParseUint(name, 10, 32)
	pw, found := findPasswd(func(f []string) bool {
		if err == nil {
			return f[2] == name
		}
		return f[0] == name
	})
	switch {
	case err == nil:
		cred.Uid = uint32(uid)
	case found:
		u, _ := strconv.ParseUint(pw[2], 10, 32)
		cred.Uid = uint32(u)
	default:
		return nil, &reqError{initproto.ClassNotFound, fmt.Errorf("exec: user %q not found in /etc/passwd", name)}
	}
	if found {
		g, _ := strconv.ParseUint(pw[3], 10, 32)
		cred.Gid = uint32(g)
		cred.Groups = supplementary(pw[0])
	}
	if hasGroup {
		gid, err := lookupGroup(group)
		if err != nil {
			return nil, err
		}
		cred.Gid = gid
	}
	return cred, nil
}

func lookupGroup(group string) (uint32, error) {
	if g, err := strconv.ParseUint(group, 10, 32); err == nil {
		return uint32(g), nil
	}
	var gid uint32
	ok := scanColon("/etc/group", func(f []string) bool {
		if len(f) >= 3 && f[0] == group {
			g, err := strconv.ParseUint(f[2], 10, 32)
			gid = uint32(g)
			return err == nil
		}
		return false
	})
	if !ok {
		return 0, &reqError{initproto.ClassNotFound, fmt.Errorf("exec: group %q not found in /etc/group", group)}
	}
	return gid, nil
}

func findPasswd(match func(f []string) bool) ([]string, bool) {
	var entry []string
	ok := scanColon("/etc/passwd", func(f []string) bool {
		if len(f) >= 4 && match(f) {
			entry = f
			return true
		}
		return false
	})
	return entry, ok
}

func supplementary(name string) []uint32 {
	var gids []uint32
	scanColon("/etc/group", func(f []string) bool {
		if len(f) < 4 {
			return false
		}
		for _, m := range strings.Split(f[3], ",") {
			if m == name {
				if g, err := strconv.ParseUint(f[2], 10, 32); err == nil {
					gids = append(gids, uint32(g))
				}
			}
		}
		return false
	})
	return gids
}

// scanColon calls fn with the fields of each line until it returns true.
func scanColon(file string, fn func(f []string) bool) bool {
	f, err := os.Open(file)
	if err != nil {
		return false
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := sc.Text()
		if line == "" || line[0] == '#' {
			continue
		}
		if fn(strings.Split(line, ":")) {
			return true
		}
	}
	return false
}

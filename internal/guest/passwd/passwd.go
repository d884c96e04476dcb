// Package passwd turns an exec's user ("name", "uid", "uid:gid", "name:group")
// into credentials from a sandbox's own /etc/passwd and /etc/group. Both the
// container init and the microVM guest agent use it through
// internal/guest/exec, reading the files of the root they serve. It imports
// nothing from corral (it is linked into both static supervisors).
package passwd

import (
	"bufio"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// NotFoundError says which user or group the files lack.
type NotFoundError struct {
	What, Name, File string
}

func (e *NotFoundError) Error() string {
	return fmt.Sprintf("exec: %s %q not found in %s", e.What, e.Name, e.File)
}

// Lookup resolves user against root's /etc/passwd and /etc/group ("" root:
// the current one). "" means root. A numeric "uid:gid" reads no file, so an
// exec as the node's default "0:0" depends on nothing in the sandbox.
func Lookup(root, user string) (*syscall.Credential, error) {
	if user == "" {
		user = "0"
	}
	name, group, hasGroup := strings.Cut(user, ":")
	if hasGroup {
		uid, uerr := strconv.ParseUint(name, 10, 32)
		gid, gerr := strconv.ParseUint(group, 10, 32)
		if uerr == nil && gerr == nil {
			return &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid), Groups: []uint32{}}, nil
		}
	}
	passwdFile, groupFile := root+"/etc/passwd", root+"/etc/group"
	key, stamps := root+"\x00"+user, [2]stamp{stampOf(passwdFile), stampOf(groupFile)}
	if c, ok := cache.get(key, stamps); ok {
		return c, nil
	}
	cred, err := lookupFiles(passwdFile, groupFile, name, group, hasGroup)
	if err == nil {
		cache.put(key, stamps, cred)
	}
	return cred, err
}

func lookupFiles(passwdFile, groupFile, name, group string, hasGroup bool) (*syscall.Credential, error) {
	cred := &syscall.Credential{Groups: []uint32{}}
	uid, err := strconv.ParseUint(name, 10, 32)
	var pw []string
	found := scanColon(passwdFile, func(f []string) bool {
		if len(f) < 4 || (err == nil && f[2] != name) || (err != nil && f[0] != name) {
			return false
		}
		pw = f
		return true
	})
	switch {
	case err == nil:
		cred.Uid = uint32(uid)
	case found:
		u, _ := strconv.ParseUint(pw[2], 10, 32)
		cred.Uid = uint32(u)
	default:
		return nil, &NotFoundError{"user", name, "/etc/passwd"}
	}
	if found {
		g, _ := strconv.ParseUint(pw[3], 10, 32)
		cred.Gid = uint32(g)
		cred.Groups = append(cred.Groups, supplementary(groupFile, pw[0])...)
	}
	if hasGroup {
		gid, err := lookupGroup(groupFile, group)
		if err != nil {
			return nil, err
		}
		cred.Gid = gid
	}
	return cred, nil
}

func lookupGroup(file, group string) (uint32, error) {
	if g, err := strconv.ParseUint(group, 10, 32); err == nil {
		return uint32(g), nil
	}
	var gid uint32
	ok := scanColon(file, func(f []string) bool {
		if len(f) >= 3 && f[0] == group {
			g, err := strconv.ParseUint(f[2], 10, 32)
			gid = uint32(g)
			return err == nil
		}
		return false
	})
	if !ok {
		return 0, &NotFoundError{"group", group, "/etc/group"}
	}
	return gid, nil
}

// supplementary lists the groups naming user as a member.
func supplementary(file, user string) []uint32 {
	var gids []uint32
	scanColon(file, func(f []string) bool {
		if len(f) < 4 {
			return false
		}
		for _, m := range strings.Split(f[3], ",") {
			if m == user {
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

// stamp identifies one version of a file: a change to it moves its ctime
// (or, replaced, its inode).
type stamp struct {
	dev, ino  uint64
	size      int64
	ctime     syscall.Timespec
	missing   bool
	unsettled bool // changed within the last second: not to be trusted
}

// settle is how old a file's last change must be for its stamp to identify
// its content. Timestamps are coarse (a clock tick), so a write in the
// same tick as a stat could leave the ctime as it was; a second later,
// any write moves it.
const settle = time.Second

func stampOf(file string) stamp {
	var st syscall.Stat_t
	if err := syscall.Stat(file, &st); err != nil {
		return stamp{missing: true}
	}
	ctime := time.Unix(st.Ctim.Sec, st.Ctim.Nsec)
	return stamp{dev: st.Dev, ino: st.Ino, size: st.Size, ctime: st.Ctim, unsettled: time.Since(ctime) < settle}
}

// cache keeps the credentials of each root and user while both files keep
// their stamps: a pooled sandbox's init looks its user up on every call,
// and two stats cost less than reading and parsing both files.
var cache = credCache{m: map[string]cachedCred{}}

// maxCached bounds the cache (users are few; a caller cycling through
// numeric ids must not grow it without end).
const maxCached = 64

type cachedCred struct {
	stamps [2]stamp
	cred   syscall.Credential
}

type credCache struct {
	mu sync.Mutex
	m  map[string]cachedCred
}

func (c *credCache) get(key string, stamps [2]stamp) (*syscall.Credential, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	e, ok := c.m[key]
	if !ok || e.stamps != stamps {
		return nil, false
	}
	cred := e.cred
	cred.Groups = slices.Clone(e.cred.Groups)
	return &cred, true
}

func (c *credCache) put(key string, stamps [2]stamp, cred *syscall.Credential) {
	if stamps[0].unsettled || stamps[1].unsettled {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.m) >= maxCached {
		clear(c.m)
	}
	c.m[key] = cachedCred{stamps: stamps, cred: syscall.Credential{Uid: cred.Uid, Gid: cred.Gid, Groups: slices.Clone(cred.Groups)}}
}

// Package guestexec holds the rules both in-sandbox supervisors apply to
// a command before they fork it — corral-init in a container sandbox
// (internal/guest/init) and corral-agent in a microVM guest
// (internal/guest/agent) — so that a command fails, and holds capabilities,
// the same way on every backend: the capability set, the user lookup, the
// cwd check and the PATH search. Errors are errdefs kinds, checked by the
// backend conformance suite (internal/backend/backendtest).
//
// It is linked into both static supervisors: it imports errdefs,
// guest/passwd and x/sys/unix only.
package guestexec

import (
	"errors"
	"os"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/corral-dev/corral/internal/errdefs"
	"github.com/corral-dev/corral/internal/guest/passwd"
)

// Caps is the capability set of a sandbox's commands (bounding, permitted,
// effective and inheritable). Everything else — SYS_ADMIN (mounts),
// SYS_PTRACE (the supervisor's memory and channel), NET_RAW, MKNOD,
// SYS_CHROOT, SYS_MODULE, SYS_RAWIO (/proc/kcore, /dev/mem), SYS_BOOT,
// SYS_RESOURCE, BPF, PERFMON … — is dropped from the bounding set, so no
// process inside can ever regain it.
var Caps = []uintptr{
	unix.CAP_CHOWN,
	unix.CAP_DAC_OVERRIDE,
	unix.CAP_FOWNER,
	unix.CAP_FSETID,
	unix.CAP_KILL,
	unix.CAP_SETGID,
	unix.CAP_SETUID,
	unix.CAP_SETFCAP,
	unix.CAP_NET_BIND_SERVICE,
}

// DefaultPath is searched when the command's environment has no PATH.
const DefaultPath = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

// User turns "", "name", "uid", "uid:gid" or "name:group" into
// credentials from the root's own /etc/passwd and /etc/group ("" is
// root); an unknown name is errdefs.NotFound.
func User(user string) (*syscall.Credential, error) {
	cred, err := passwd.Lookup("", user)
	if nf := (*passwd.NotFoundError)(nil); errors.As(err, &nf) {
		return nil, errdefs.NotFound("%v", err)
	}
	return cred, err
}

// Cwd returns the command's working directory ("" is "/"); one that is
// not an existing directory is errdefs.InvalidArgument.
func Cwd(cwd string) (string, error) {
	if cwd == "" {
		cwd = "/"
	}
	if st, err := os.Stat(cwd); err != nil || !st.IsDir() {
		return "", errdefs.InvalidArgument("exec: cwd %s does not exist or is not a directory", cwd)
	}
	return cwd, nil
}

// LookPath resolves argv[0]: a name with a slash as it is, any other on
// the PATH of env. A missing file is errdefs.NotFound, one that is not an
// executable regular file errdefs.PermissionDenied.
func LookPath(name string, env []string) (string, error) {
	if strings.Contains(name, "/") {
		if err := executable(name); err != nil {
			return "", err
		}
		return name, nil
	}
	path := DefaultPath
	for _, kv := range env {
		if v, ok := strings.CutPrefix(kv, "PATH="); ok {
			path = v
		}
	}
	for _, dir := range strings.Split(path, ":") {
		if dir == "" {
			dir = "."
		}
		p := dir + "/" + name
		if executable(p) == nil {
			return p, nil
		}
	}
	return "", errdefs.NotFound("exec: %s: executable file not found in $PATH", name)
}

func executable(p string) error {
	st, err := os.Stat(p)
	if err != nil {
		return errdefs.NotFound("exec: %s: no such file", p)
	}
	if !st.Mode().IsRegular() || st.Mode().Perm()&0o111 == 0 {
		return errdefs.PermissionDenied("exec: %s: not an executable file", p)
	}
	return nil
}

package seccomp

import (
	"fmt"

	"golang.org/x/sys/unix"
)

// Profile is the reviewed policy: a table of rules keyed by x86_64 syscall name. Every
// syscall number the ABI table (x86_64Syscalls) knows but the profile does not name gets
// EPERM; numbers past the end of the ABI table, and unassigned holes in it, get ENOSYS.
type Profile struct {
	rules map[string]rule
}

// action is what the filter returns for a syscall.
type action uint8

const (
	actAllow  action = iota // run the syscall
	actEPERM                // fail with EPERM: the caller is refused
	actENOSYS               // fail with ENOSYS: libc falls back to an older call
	actKill                 // kill the whole process (only for a foreign architecture)
)

func (a action) String() string {
	switch a {
	case actAllow:
		return "allow"
	case actEPERM:
		return "EPERM"
	case actENOSYS:
		return "ENOSYS"
	case actKill:
		return "kill"
	}
	return fmt.Sprintf("action(%d)", uint8(a))
}

// cond holds when (low32(arg[arg]) & mask) == value. Only the low 32 bits of an argument
// are ever inspected: every argument corral filters is one the kernel itself truncates to
// 32 bits (ioctl cmd, socket family and type, personality, mknod mode) or a flag word whose
// filtered bits all lie in the low half (clone flags). Comparing the low word only is
// therefore exact, and a caller cannot dodge a rule by setting high bits.
type cond struct {
	arg   uint8
	mask  uint32
	value uint32
}

// check is one argument rule: when every cond holds, the syscall gets then.
type check struct {
	when []cond
	then action
	why  string
}

// rule is one profile entry. Checks run in order and the first that matches decides;
// if none matches the syscall gets def.
type rule struct {
	def    action
	checks []check
	why    string // who needs it, or which attack refusing it stops
	origin string // "docker", "corral", or "corral (docker: allow)" for a tightening
}

func allow(why string) rule       { return rule{def: actAllow, why: why} }
func deny(why string) rule        { return rule{def: actEPERM, why: why} }
func nosys(why string) rule       { return rule{def: actENOSYS, why: why} }
func eq(arg uint8, v uint32) cond { return cond{arg: arg, mask: 0xffffffff, value: v} }

func masked(arg uint8, mask, v uint32) cond { return cond{arg: arg, mask: mask, value: v} }

// DefaultProfile returns corral's sandbox policy: Docker's default allowlist for x86_64
// (floorRules) with corral's tightenings and argument rules (corralRules) on top.
func DefaultProfile() *Profile {
	p := &Profile{rules: make(map[string]rule, len(floorRules)+len(corralRules))}
	for name, r := range floorRules {
		r.origin = "docker"
		p.rules[name] = r
	}
	for name, r := range corralRules {
		r.origin = "corral"
		if old, ok := p.rules[name]; ok {
			r.origin = "corral (docker: " + old.def.String() + ")"
		}
		p.rules[name] = r
	}
	return p
}

// PoolInitProfile is the filter of a pooled (resettable) sandbox's init, on
// which the commands' DefaultProfile is stacked: init itself re-mounts the
// sandbox's view on reset (mount, umount2, and move_mount to attach a view
// the node made) and confines the thread that
// forks commands (unshare of CLONE_FS only, chroot; of CLONE_NEWNET only
// for a recycled sandbox's next tenant). Commands never run
// under this profile alone: they inherit DefaultProfile on top of it, and
// with stacked filters the strictest answer wins.
func PoolInitProfile() *Profile {
	p := DefaultProfile()
	for _, name := range []string{"mount", "umount2", "chroot", "mknod", "mknodat"} {
		p.rules[name] = rule{def: actAllow, origin: "corral pool init", why: "pooled sandbox init: reset re-mounts the view; the forking thread is chrooted into it"}
	}
	p.rules["move_mount"] = rule{def: actAllow, origin: "corral pool init",
		why: "recyclable container sandbox: init attaches the fresh view the node made (a detached mount) after a reset found the last one written to"}
	p.rules["unshare"] = rule{def: actEPERM, origin: "corral pool init",
		why: "pooled sandbox init: only CLONE_FS, to give the forking thread its own root, and CLONE_NEWNET, to give a recycled sandbox's next tenant a network namespace of its own",
		checks: []check{
			{when: []cond{eq(0, unix.CLONE_FS)}, then: actAllow, why: "CLONE_FS only"},
			{when: []cond{eq(0, unix.CLONE_NEWNET)}, then: actAllow, why: "CLONE_NEWNET only: owned by the sandbox's user namespace, like the one it replaces"},
		}}
	return p
}

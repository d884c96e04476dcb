//go:build linux && amd64

package seccomp

import (
	"fmt"
	"maps"
	"slices"
	"strings"
)

// decide is the reference semantics of a profile for one call, used by the tests to check
// the compiled program against the table it came from.
func (p *Profile) decide(arch, nr uint32, args [6]uint64) action {
	if arch != auditArchX86_64 {
		return actKill
	}
	if nr&x32SyscallBit != 0 {
		return actEPERM
	}
	if int(nr) >= len(x86_64Syscalls) || x86_64Syscalls[nr] == "" {
		return actENOSYS
	}
	r, ok := p.rules[x86_64Syscalls[nr]]
	if !ok {
		return actEPERM
	}
	for _, c := range r.checks {
		match := true
		for _, w := range c.when {
			match = match && uint32(args[w.arg])&w.mask == w.value
		}
		if match {
			return c.then
		}
	}
	return r.def
}

// dump renders the profile as one line per syscall number (plus one per argument check),
// for the golden file: reviewers see every policy change as a diff.
func (p *Profile) dump() string {
	var b strings.Builder
	byName := make(map[string]int, len(x86_64Syscalls))
	for nr, name := range x86_64Syscalls {
		if name != "" {
			byName[name] = nr
		}
	}
	for nr, name := range x86_64Syscalls {
		if name == "" {
			continue
		}
		r, ok := p.rules[name]
		if !ok {
			fmt.Fprintf(&b, "%3d %-24s EPERM   (not in profile)\n", nr, name)
			continue
		}
		fmt.Fprintf(&b, "%3d %-24s %-7s [%s] %s\n", nr, name, r.def, r.origin, r.why)
		for _, c := range r.checks {
			conds := make([]string, len(c.when))
			for i, w := range c.when {
				if w.mask == 0xffffffff {
					conds[i] = fmt.Sprintf("arg%d==%#x", w.arg, w.value)
				} else {
					conds[i] = fmt.Sprintf("arg%d&%#x==%#x", w.arg, w.mask, w.value)
				}
			}
			fmt.Fprintf(&b, "      if %s -> %s: %s\n", strings.Join(conds, " && "), c.then, c.why)
		}
	}
	for _, name := range slices.Sorted(maps.Keys(p.rules)) {
		if _, ok := byName[name]; !ok {
			fmt.Fprintf(&b, "??? %s: not an x86_64 syscall\n", name)
		}
	}
	return b.String()
}

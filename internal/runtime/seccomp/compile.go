package seccomp

import (
	"errors"
	"fmt"

	"golang.org/x/net/bpf"
	"golang.org/x/sys/unix"
)

const (
	auditArchX86_64 = 0xc000003e // AUDIT_ARCH_X86_64
	x32SyscallBit   = 0x40000000 // __X32_SYSCALL_BIT: x32 ABI calls arrive with arch x86_64
	maxInsns        = 4096       // BPF_MAXINSNS

	// struct seccomp_data offsets. Argument i is a u64 at 16+8i; on little-endian x86_64
	// its low 32 bits are the word at 16+8i.
	offNr   = 0
	offArch = 4
	offArgs = 16
)

func (a action) ret() uint32 {
	switch a {
	case actAllow:
		return unix.SECCOMP_RET_ALLOW
	case actEPERM:
		return unix.SECCOMP_RET_ERRNO | uint32(unix.EPERM)
	case actENOSYS:
		return unix.SECCOMP_RET_ERRNO | uint32(unix.ENOSYS)
	}
	return unix.SECCOMP_RET_KILL_PROCESS
}

// Compile turns a profile into a classic BPF program for x86_64. The program:
//
//  1. kills the process unless seccomp_data.arch is AUDIT_ARCH_X86_64: a 32-bit (int 0x80)
//     call would be read against the wrong syscall table, and answering EPERM to every call
//     of a foreign-ABI process, exit included, would leave it spinning instead of dying;
//  2. refuses x32 calls (nr & 0x40000000) with EPERM;
//  3. answers ENOSYS above the last syscall of the ABI table, so libc falls back;
//  4. finds the number's rule by binary search over runs of numbers with the same outcome,
//     and runs that rule's argument checks, if any, against the arguments' low 32 bits.
func Compile(p *Profile) ([]unix.SockFilter, error) {
	if p == nil {
		return nil, errors.New("seccomp: nil profile")
	}
	known := make(map[string]bool, len(x86_64Syscalls))
	for _, name := range x86_64Syscalls {
		known[name] = name != ""
	}
	for name, r := range p.rules {
		if !known[name] {
			return nil, fmt.Errorf("seccomp: profile names %q, which is not an x86_64 syscall", name)
		}
		for i, c := range r.checks {
			if len(c.when) == 0 {
				return nil, fmt.Errorf("seccomp: %s: check %d has no condition", name, i)
			}
			for _, w := range c.when {
				if w.arg > 5 || w.value&^w.mask != 0 {
					return nil, fmt.Errorf("seccomp: %s: check %d: bad condition %+v", name, i, w)
				}
			}
		}
	}

	// Runs of consecutive numbers with the same plain outcome become one range; a number
	// with argument checks is a range of its own.
	var ranges []span
	for nr, name := range x86_64Syscalls {
		s := span{first: uint32(nr), act: actENOSYS}
		if name != "" {
			s.act = actEPERM
			if r, ok := p.rules[name]; ok {
				s.act = r.def
				if len(r.checks) > 0 {
					s.rule = &r
				}
			}
		}
		if n := len(ranges); n > 0 && s.rule == nil && ranges[n-1].rule == nil && ranges[n-1].act == s.act {
			continue
		}
		ranges = append(ranges, s)
	}

	prog := []bpf.Instruction{
		bpf.LoadAbsolute{Off: offArch, Size: 4},
		bpf.JumpIf{Cond: bpf.JumpEqual, Val: auditArchX86_64, SkipTrue: 1},
		bpf.RetConstant{Val: actKill.ret()},
		bpf.LoadAbsolute{Off: offNr, Size: 4},
		bpf.JumpIf{Cond: bpf.JumpBitsSet, Val: x32SyscallBit, SkipFalse: 1},
		bpf.RetConstant{Val: actEPERM.ret()},
		bpf.JumpIf{Cond: bpf.JumpGreaterThan, Val: uint32(len(x86_64Syscalls) - 1), SkipFalse: 1},
		bpf.RetConstant{Val: actENOSYS.ret()},
	}
	prog = append(prog, searchTree(ranges)...)
	if len(prog) > maxInsns {
		return nil, fmt.Errorf("seccomp: program has %d instructions, the kernel takes at most %d", len(prog), maxInsns)
	}
	raw, err := bpf.Assemble(prog)
	if err != nil {
		return nil, fmt.Errorf("seccomp: assemble: %w", err)
	}
	out := make([]unix.SockFilter, len(raw))
	for i, r := range raw {
		out[i] = unix.SockFilter{Code: r.Op, Jt: r.Jt, Jf: r.Jf, K: r.K}
	}
	return out, nil
}

// span is a run of syscall numbers starting at first that share one outcome.
type span struct {
	first uint32
	act   action
	rule  *rule // non-nil when the outcome depends on arguments
}

// searchTree emits a binary search over ranges, which cover the numbers from ranges[0].first
// up to the end of the ABI table; A holds the syscall number. Conditional jumps reach only
// 255 instructions, so a long left subtree is stepped over with an unconditional jump.
func searchTree(ranges []span) []bpf.Instruction {
	if len(ranges) == 1 {
		return leafCode(ranges[0])
	}
	mid := len(ranges) / 2
	left, right := searchTree(ranges[:mid]), searchTree(ranges[mid:])
	pivot := ranges[mid].first
	var out []bpf.Instruction
	if len(left) <= 255 {
		out = append(out, bpf.JumpIf{Cond: bpf.JumpGreaterOrEqual, Val: pivot, SkipTrue: uint8(len(left))})
	} else {
		out = append(out,
			bpf.JumpIf{Cond: bpf.JumpGreaterOrEqual, Val: pivot, SkipFalse: 1},
			bpf.Jump{Skip: uint32(len(left))})
	}
	out = append(out, left...)
	return append(out, right...)
}

// leafCode returns the outcome of one range: a return, or the rule's checks in order, each
// a chain of "load low word, mask, compare" that falls through to the next check on a
// mismatch, then the rule's default.
func leafCode(s span) []bpf.Instruction {
	if s.rule == nil {
		return []bpf.Instruction{bpf.RetConstant{Val: s.act.ret()}}
	}
	var out []bpf.Instruction
	for _, c := range s.rule.checks {
		var block []bpf.Instruction
		for _, w := range c.when {
			block = append(block, bpf.LoadAbsolute{Off: offArgs + 8*uint32(w.arg), Size: 4})
			if w.mask != 0xffffffff {
				block = append(block, bpf.ALUOpConstant{Op: bpf.ALUOpAnd, Val: w.mask})
			}
			block = append(block, bpf.JumpIf{Cond: bpf.JumpEqual, Val: w.value}) // SkipFalse set below
		}
		block = append(block, bpf.RetConstant{Val: c.then.ret()})
		for i, ins := range block {
			if j, ok := ins.(bpf.JumpIf); ok {
				j.SkipFalse = uint8(len(block) - i - 1) // past this check's return
				block[i] = j
			}
		}
		out = append(out, block...)
	}
	return append(out, bpf.RetConstant{Val: s.rule.def.ret()})
}

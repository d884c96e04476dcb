// Package seccomp owns corral's syscall filter for container sandboxes: the reviewed policy
// (a table keyed by x86_64 syscall name, each entry saying who needs the call or which attack
// refusing it stops), its compiler to classic BPF, and the call that installs the filter on
// every thread of the sandbox init.
//
// The floor is Docker's default seccomp allowlist for x86_64 (table_floor.go); corral's
// argument rules and tightenings override it (table_corral.go). Known syscalls that are not
// allowed get EPERM; numbers the ABI table does not know get ENOSYS so libc falls back.
// testdata/default.golden shows the whole compiled policy, so every change shows in review.
//
// The package is linked into the sandbox init, a small static binary: it must import nothing
// from corral and nothing beyond the standard library, golang.org/x/sys and
// golang.org/x/net/bpf.
package seccomp

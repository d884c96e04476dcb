package seccomp

// x86_64 values of the constants the argument rules use. They are spelled out (not taken
// from x/sys, whose values follow the build machine) because the profile describes the
// x86_64 ABI; TestConstantsMatchUnix checks them against x/sys on amd64.
const (
	tiocsti         = 0x5412     // TIOCSTI: push bytes into a terminal's input queue
	tioclinux       = 0x541c     // TIOCLINUX: VT console control, incl. selection paste
	fsIocFsgetxattr = 0x801c581f // FS_IOC_FSGETXATTR = _IOR('X', 31, struct fsxattr)
	fsIocFssetxattr = 0x401c5820 // FS_IOC_FSSETXATTR = _IOW('X', 32, struct fsxattr)
	iocTypeMask     = 0xff00     // ioctl "type" byte, bits 8..15 of the command
	iocTypeX        = 'X' << 8   // XFS_IOC_*, FIFREEZE, FITHAW, FITRIM, FS_IOC_FS[GS]ETXATTR

	afUnix    = 1
	afInet    = 2
	afInet6   = 10
	afNetlink = 16
	// netlinkKobjectUevent is socket's protocol (argument 2) for the kernel's device events.
	netlinkKobjectUevent = 15
	sockTypeMask         = 0xf // SOCK_NONBLOCK and SOCK_CLOEXEC are OR-ed into socket's type
	sockRaw              = 3

	// cloneNSFlags are the namespace flags of clone(2). The kernel reads clone's flags as
	// lower_32_bits(arg0). CLONE_NEWTIME (0x80) lies in CSIGNAL for clone(), where it would
	// be an exit signal >= 128 that no program uses; it is included so no bit is missed.
	cloneNSFlags = 0x00020000 | 0x04000000 | 0x08000000 | 0x10000000 | // NEWNS NEWUTS NEWIPC NEWUSER
		0x20000000 | 0x40000000 | 0x02000000 | 0x00000080 // NEWPID NEWNET NEWCGROUP NEWTIME

	sIFMT  = 0o170000
	sIFBLK = 0o060000
	sIFCHR = 0o020000
)

// deviceNodeChecks refuse block and character device nodes for mknod(at); mode is argument
// modeArg. FIFOs, sockets and regular files stay allowed.
func deviceNodeChecks(modeArg uint8) []check {
	return []check{
		{when: []cond{masked(modeArg, sIFMT, sIFBLK)}, then: actEPERM, why: "block device node: raw access to a disk, bypassing the filesystem"},
		{when: []cond{masked(modeArg, sIFMT, sIFCHR)}, then: actEPERM, why: "char device node: /dev/mem, /dev/kmsg-style access"},
	}
}

// corralRules are corral's entries: Docker's argument rules (clone, personality, socket),
// corral's tightenings of Docker's floor, and an explicit refusal for every other x86_64
// syscall so the table is total and each refusal says which attack it stops.
var corralRules = map[string]rule{
	// Argument rules.
	"clone": {def: actEPERM, why: "fork and threads (Go runtime, pthread_create, Go os/exec's CLONE_VFORK|CLONE_VM)",
		checks: []check{{when: []cond{masked(0, cloneNSFlags, 0)}, then: actAllow,
			why: "no namespace flag; new user/mount/net namespaces unlock mount, pivot_root and kernel surface for privilege escalation"}}},
	"clone3": nosys("flags live in memory seccomp cannot read; ENOSYS makes glibc and Go fall back to clone"),
	"ioctl": {def: actAllow, why: "everyone: terminals, FIONREAD, FIONBIO; FICLONE/FICLONERANGE/FIDEDUPERANGE (type 0x94) stay allowed: cp --reflink, same-fs only, checks fd permissions",
		checks: []check{
			{when: []cond{eq(1, tiocsti)}, then: actEPERM, why: "TIOCSTI: inject keystrokes into the terminal of a shell that reads it"},
			{when: []cond{eq(1, tioclinux)}, then: actEPERM, why: "TIOCLINUX: console selection paste, same injection via a VT"},
			{when: []cond{eq(1, fsIocFssetxattr)}, then: actEPERM, why: "FS_IOC_FSSETXATTR: set project ids/extent hints, escape disk quota"},
			{when: []cond{eq(1, fsIocFsgetxattr)}, then: actEPERM, why: "FS_IOC_FSGETXATTR: probe the backing filesystem's project quota layout"},
			{when: []cond{masked(1, iocTypeMask, iocTypeX)}, then: actEPERM,
				why: "every 'X' command: XFS_IOC_SWAPEXT/GOINGDOWN/FSBULKSTAT (shut down or scan the host fs), FIFREEZE/FITHAW (freeze the shared fs), FITRIM"},
		}},
	"mknod":   {def: actAllow, why: "mkfifo, socket files", checks: deviceNodeChecks(1)},
	"mknodat": {def: actAllow, why: "mkfifo, socket files", checks: deviceNodeChecks(2)},
	"personality": {def: actEPERM, why: "setarch/uname26 as Docker allows; others (READ_IMPLIES_EXEC, ADDR_NO_RANDOMIZE) weaken exploit mitigations",
		checks: []check{
			{when: []cond{eq(0, 0x0)}, then: actAllow, why: "PER_LINUX"},
			{when: []cond{eq(0, 0x8)}, then: actAllow, why: "PER_LINUX32 (setarch i686 uname)"},
			{when: []cond{eq(0, 0x20000)}, then: actAllow, why: "UNAME26"},
			{when: []cond{eq(0, 0x20008)}, then: actAllow, why: "PER_LINUX32|UNAME26"},
			{when: []cond{eq(0, 0xffffffff)}, then: actAllow, why: "query the current persona"},
		}},
	"socket": {def: actEPERM, why: "other families refused: AF_ALG (kernel crypto bugs), AF_VSOCK (reach the host and VMs), AF_PACKET (sniff, spoof, CVE-2020-14386), AF_KEY, AF_XDP, ...",
		checks: []check{
			{when: []cond{eq(0, afUnix)}, then: actAllow, why: "AF_UNIX: local IPC, init's control socket"},
			{when: []cond{eq(0, afInet), masked(1, sockTypeMask, sockRaw)}, then: actEPERM, why: "raw IPv4: spoofed packets, ICMP scans around the network rules"},
			{when: []cond{eq(0, afInet)}, then: actAllow, why: "AF_INET: TCP/UDP and ICMP datagram (ping) sockets"},
			{when: []cond{eq(0, afInet6), masked(1, sockTypeMask, sockRaw)}, then: actEPERM, why: "raw IPv6: as raw IPv4"},
			{when: []cond{eq(0, afInet6)}, then: actAllow, why: "AF_INET6: TCP/UDP"},
			{when: []cond{eq(0, afNetlink), eq(2, netlinkKobjectUevent)}, then: actEPERM,
				why: "NETLINK_KOBJECT_UEVENT: the host's device events (a loop device attached for every other sandbox created); no sandboxed program needs udev's feed"},
			{when: []cond{eq(0, afNetlink)}, then: actAllow, why: "AF_NETLINK: glibc getaddrinfo(AI_ADDRCONFIG), ip addr"},
		}},
	"socketpair": {def: actEPERM, why: "other families have no socketpair or only add kernel surface",
		checks: []check{{when: []cond{eq(0, afUnix)}, then: actAllow, why: "AF_UNIX: Python multiprocessing, subprocess pipes"}}},

	// Tightenings of the floor.
	"name_to_handle_at": deny("companion of open_by_handle_at: leaks file handles for the shocker escape"),

	// Refusals Docker also makes, named with the attack they stop.
	"_sysctl":                 deny("obsolete sysctl interface"),
	"acct":                    deny("process accounting writes to a host-chosen file, host-wide effect"),
	"add_key":                 deny("kernel keyring is not namespaced: read/plant keys of other sandboxes, keyring CVEs"),
	"afs_syscall":             deny("unimplemented"),
	"bpf":                     deny("eBPF: verifier bugs are the top kernel LPE source; tracing leaks host data"),
	"chroot":                  deny("chroot escapes with a held directory fd; no agent workload needs it"),
	"clock_settime":           deny("change the host clock (time is not namespaced for CLOCK_REALTIME)"),
	"create_module":           deny("load kernel code"),
	"delete_module":           deny("unload kernel modules the host relies on"),
	"fanotify_init":           deny("fanotify watches whole mounts/filesystems, including shared layers"),
	"file_getattr":            deny("syscall form of FS_IOC_FSGETXATTR (6.17+): same quota probing"),
	"file_setattr":            deny("syscall form of FS_IOC_FSSETXATTR (6.17+): same quota escape"),
	"finit_module":            deny("load kernel code"),
	"fsconfig":                deny("new mount API: configure a filesystem to mount"),
	"fsmount":                 deny("new mount API: mount"),
	"fsopen":                  deny("new mount API: open a filesystem type (superblock parser bugs, CVE-2022-0185)"),
	"fspick":                  deny("new mount API: reconfigure an existing mount"),
	"get_kernel_syms":         deny("obsolete module interface"),
	"get_mempolicy":           deny("NUMA policy: Docker needs CAP_SYS_NICE; libnuma copes with EPERM"),
	"getpmsg":                 deny("unimplemented STREAMS call"),
	"init_module":             deny("load kernel code"),
	"io_uring_enter":          nosys("io_uring: large, CVE-rich surface that bypasses seccomp for the ops it runs; ENOSYS so libuv (node) and liburing users fall back"),
	"io_uring_register":       nosys("io_uring: see io_uring_enter"),
	"io_uring_setup":          nosys("io_uring: see io_uring_enter"),
	"ioperm":                  deny("direct I/O port access to host hardware"),
	"iopl":                    deny("direct I/O port access to host hardware"),
	"kcmp":                    deny("compare kernel objects of other processes: KASLR/ptrace-class info leak"),
	"kexec_file_load":         deny("replace the running host kernel"),
	"kexec_load":              deny("replace the running host kernel"),
	"keyctl":                  deny("kernel keyring is not namespaced: read other sandboxes' keys, keyring CVEs"),
	"listns":                  deny("enumerate namespaces (6.18+): discover other sandboxes"),
	"lookup_dcookie":          deny("profiling interface that resolves host paths"),
	"lsm_get_self_attr":       deny("LSM attributes: Docker needs CAP_SYS_ADMIN"),
	"lsm_list_modules":        deny("LSM introspection: Docker needs CAP_SYS_ADMIN"),
	"lsm_set_self_attr":       deny("change own LSM label: Docker needs CAP_SYS_ADMIN"),
	"mbind":                   deny("NUMA policy: Docker needs CAP_SYS_NICE"),
	"migrate_pages":           deny("move other processes' memory between NUMA nodes"),
	"mount":                   deny("mount over the sandbox's view or expose host filesystems"),
	"mount_setattr":           deny("flip mounts to read-write or idmapped"),
	"move_mount":              deny("new mount API: attach or move mounts"),
	"move_pages":              deny("move other processes' memory between NUMA nodes"),
	"nfsservctl":              deny("unimplemented"),
	"open_by_handle_at":       deny("shocker: open host files by guessed handle, outside the mount namespace"),
	"open_tree":               deny("new mount API: clone a mount tree"),
	"open_tree_attr":          deny("new mount API: clone a mount tree with attributes (6.15+)"),
	"perf_event_open":         deny("perf: side channels on the host and other sandboxes, perf CVEs"),
	"pidfd_getfd":             deny("steal fds from another process (ptrace-class)"),
	"pivot_root":              deny("change the sandbox root: escape preparation"),
	"process_madvise":         deny("act on another process's memory (ptrace-class)"),
	"process_vm_readv":        deny("read another process's memory, e.g. init's: harness secrets"),
	"process_vm_writev":       deny("write another process's memory, e.g. init's"),
	"ptrace":                  deny("trace and inject into init and other processes; ptrace-based escapes"),
	"putpmsg":                 deny("unimplemented STREAMS call"),
	"query_module":            deny("obsolete module interface"),
	"quotactl":                deny("change or read disk quotas: escape the sandbox's block/inode quota"),
	"quotactl_fd":             deny("change or read disk quotas by fd"),
	"reboot":                  deny("reboot the host or the sandbox's PID namespace (kills init)"),
	"request_key":             deny("kernel keyring: see keyctl"),
	"rseq_slice_yield":        deny("not reviewed yet (newer than Docker's list)"),
	"security":                deny("unimplemented"),
	"set_mempolicy":           deny("NUMA policy: Docker needs CAP_SYS_NICE"),
	"set_mempolicy_home_node": deny("NUMA policy: Docker needs CAP_SYS_NICE"),
	"setdomainname":           deny("change the NIS domain name: Docker needs CAP_SYS_ADMIN"),
	"sethostname":             deny("change the hostname: Docker needs CAP_SYS_ADMIN"),
	"setns":                   deny("join another namespace through a leaked fd"),
	"settimeofday":            deny("change the host clock"),
	"swapoff":                 deny("host swap configuration"),
	"swapon":                  deny("host swap configuration"),
	"sysfs":                   deny("obsolete filesystem-type query"),
	"syslog":                  deny("read the host kernel log: addresses (KASLR) and other sandboxes' events"),
	"tuxcall":                 deny("unimplemented"),
	"umount2":                 deny("unmount masks over /proc files and reveal what they hide"),
	"unshare":                 deny("new user/mount namespaces: the entry point of most container escapes"),
	"uprobe":                  deny("kernel uprobe trampoline (6.16+): not in Docker's list"),
	"uselib":                  deny("obsolete a.out loader"),
	"userfaultfd":             deny("stall kernel page faults at will: turns kernel races into reliable exploits"),
	"ustat":                   deny("obsolete filesystem stats"),
	"vhangup":                 deny("hang up the terminal: Docker needs CAP_SYS_TTY_CONFIG"),
	"vserver":                 deny("unimplemented"),
}

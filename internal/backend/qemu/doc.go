// Package qemu owns what the two QEMU backends (microvm and vm) do alike
// with a QEMU process: its lifecycle as a sandbox's VMM (Lifecycle:
// pause, snapshot to a file after a while, restore, stop, the watch for
// an exit nobody asked for), each backend supplying the steps
// (LifecycleOps); starting it in its own session (inside the
// sandbox's network namespace, with the tap as fd 3) and adopting it,
// dialling its QMP socket while watching that it still runs, saving a
// machine's state to files through QEMU's migration stream (a stopped VM
// that then quits, or a running one that continues, its guest RAM
// copied aside as a sparse image) and loading it back (-incoming defer,
// the RAM image mapped copy-on-write), the files of a snapshot dir (the
// disk copy, the state record, their size), the run dir's machine record
// and the VMM's part of it (VMM: process, snapshotted, network slot),
// the recovery of a sandbox from that record after a daemon restart
// (Recover), the host-side cost of a VMM (CPU time, resident memory), the
// VMM's host cgroup and its CPU quota (CPUGroups), a backend's run dirs
// with their cleanup, the sweep of leftovers and the VMM processes found
// by command line (RunDir), and tree copies through corral-agent. The machine types, command lines,
// agent connections and guest identities stay in the backends.
//
// It imports backend, errdefs, guest/agentclient, netpolicy, qmp,
// runtime/cgroup and runtime/launch; never a backend package, the node,
// state or API layers.
package qemu

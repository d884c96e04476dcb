// Package qemu owns what the two QEMU backends (microvm and vm) do alike
// with a QEMU process: starting it in its own session (inside the
// sandbox's network namespace, with the tap as fd 3) and adopting it,
// dialling its QMP socket while watching that it still runs, saving a
// machine's state to files through QEMU's migration stream (a stopped VM
// that then quits, or a running one that continues, its guest RAM
// copied aside as a sparse image) and loading it back (-incoming defer,
// the RAM image mapped copy-on-write), the files of a snapshot dir (the
// disk copy, the state record, their size), and the host-side cost of a
// QEMU process (CPU time, resident memory). The machine types, command
// lines and guest agents stay in the backends.
//
// It imports errdefs, netpolicy, qmp and runtime/launch; never a backend
// package, the node, state or API layers.
package qemu

package backend

// Limit names one of Resources' limits beyond memory, which every backend
// holds a sandbox to.
type Limit string

// The limits a backend may or may not enforce, named as the API's fields.
const (
	LimitCPU  Limit = "resources.cpu_millis"
	LimitPids Limit = "resources.pids"
	LimitDisk Limit = "resources.disk_bytes"
)

// LimitEnforcer is implemented by backends that say which of the limits
// above they hold every sandbox's processes to. The conformance suite
// tests each limit a backend enforces and skips, with the backend's
// reason, each it does not; a backend that does not implement
// LimitEnforcer has its limit subtests skipped as undeclared.
type LimitEnforcer interface {
	// Enforces returns nil when the backend enforces l, else an
	// errdefs.NotSupported error saying why not.
	Enforces(l Limit) error
}

package agent

import (
	"time"

	"golang.org/x/sys/unix"
)

// setClock sets the guest's wall clock to the node's (Unix nanoseconds;
// 0: not sent) when they differ by more than clockSlack: a microVM boots
// without an RTC at the epoch, so TLS certificates, make and anything
// comparing mtimes with the time would misbehave.
func setClock(now int64) {
	if now <= 0 {
		return
	}
	if d := time.Since(time.Unix(0, now)); d > -clockSlack && d < clockSlack {
		return
	}
	ts := unix.NsecToTimespec(now)
	if err := unix.ClockSettime(unix.CLOCK_REALTIME, &ts); err != nil {
		logf("set the clock: %v", err)
	}
}

const clockSlack = 100 * time.Millisecond

// Package accept runs the accept loop of a test's listener, for tests of
// packages below internal/testenv (it imports no corral package).
package accept

import "net"

// Each hands every connection ln accepts to handle, one at a time, in a
// goroutine of its own, until ln is closed.
func Each(ln net.Listener, handle func(net.Conn)) {
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			handle(c)
		}
	}()
}

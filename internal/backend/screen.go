package backend

import (
	"context"
	"net"
)

// ImageOwner is implemented by backends whose sandboxes boot images of
// their own store (the vm backend's disk images): the node passes
// Spec.Image through instead of resolving it to layers.
type ImageOwner interface {
	OwnsImages()
}

// Screenshot is one frame of a sandbox's screen.
type Screenshot struct {
	PNG           []byte
	Width, Height int
}

// InputEvent is one keyboard or mouse action.
type InputEvent struct {
	// Text types characters (US layout); Keys presses one combination
	// such as "ctrl-alt-t" or "enter".
	Text string
	Keys string
	// Move moves the pointer to X, Y (screen pixels); Click also clicks
	// Button ("left", "right", "middle"; default left) there; Scroll
	// turns the wheel by ScrollDelta notches (positive: down) there.
	Move        bool
	Click       bool
	Scroll      bool
	X, Y        int
	Button      string
	ScrollDelta int
}

// Screener is implemented by sandboxes with a screen, keyboard and mouse.
type Screener interface {
	// Screenshot captures the screen as PNG, scaled by scale (0 < scale
	// <= 1; 0 means 1).
	Screenshot(ctx context.Context, scale float64) (Screenshot, error)
	// SendInput delivers events in order.
	SendInput(ctx context.Context, events []InputEvent) error
}

// LiveViewer is implemented by sandboxes whose screen, keyboard and
// mouse are served as VNC (RFB) for a live view.
type LiveViewer interface {
	// DialVNC connects to the sandbox's VNC server.
	DialVNC(ctx context.Context) (net.Conn, error)
}

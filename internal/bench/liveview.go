package bench

import (
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"io"
	"time"

	"github.com/corral-dev/corral/client"
)

// liveViewFirstFrame times n live views of sandbox id: LiveView, the
// websocket, the RFB handshake (security None) and one full-screen
// framebuffer update read to its last byte (raw encoding: no
// SetEncodings is sent).
func liveViewFirstFrame(ctx context.Context, c *client.Client, id string, n int) ([]time.Duration, error) {
	var out []time.Duration
	for range n {
		start := time.Now()
		lv, err := c.LiveView(ctx, id, 0)
		if err != nil {
			return nil, err
		}
		conn, err := c.DialLiveView(ctx, lv)
		if err != nil {
			return nil, err
		}
		_ = conn.SetDeadline(time.Now().Add(2 * time.Minute))
		err = rfbFullFrame(conn)
		conn.Close()
		if err != nil {
			return nil, fmt.Errorf("live view of %s: %w", id, err)
		}
		out = append(out, time.Since(start))
	}
	return out, nil
}

// rfbFullFrame does the RFB 3.8 handshake and reads one whole-screen
// update in raw encoding.
func rfbFullFrame(rw io.ReadWriter) error {
	read := func(n int) ([]byte, error) {
		p := make([]byte, n)
		_, err := io.ReadFull(rw, p)
		return p, err
	}
	v, err := read(12)
	if err != nil || !bytes.HasPrefix(v, []byte("RFB 003.00")) {
		return fmt.Errorf("protocol version %q: %v", v, err)
	}
	if _, err := rw.Write([]byte("RFB 003.008\n")); err != nil {
		return err
	}
	cnt, err := read(1)
	if err != nil {
		return err
	}
	types, err := read(int(cnt[0]))
	if err != nil || !bytes.Contains(types, []byte{1}) {
		return fmt.Errorf("security types %v (want None): %v", types, err)
	}
	if _, err := rw.Write([]byte{1}); err != nil {
		return err
	}
	if res, err := read(4); err != nil || binary.BigEndian.Uint32(res) != 0 {
		return fmt.Errorf("security result %v: %v", res, err)
	}
	if _, err := rw.Write([]byte{1}); err != nil { // ClientInit: shared
		return err
	}
	init, err := read(24)
	if err != nil {
		return err
	}
	if _, err := read(int(binary.BigEndian.Uint32(init[20:]))); err != nil {
		return err
	}
	w, h, bpp := binary.BigEndian.Uint16(init[0:]), binary.BigEndian.Uint16(init[2:]), int(init[4])
	req := []byte{3, 0, 0, 0, 0, 0, 0, 0, 0, 0}
	binary.BigEndian.PutUint16(req[6:], w)
	binary.BigEndian.PutUint16(req[8:], h)
	if _, err := rw.Write(req); err != nil {
		return err
	}
	hdr, err := read(4)
	if err != nil || hdr[0] != 0 {
		return fmt.Errorf("framebuffer update header %v: %v", hdr, err)
	}
	for range binary.BigEndian.Uint16(hdr[2:]) {
		rect, err := read(12)
		if err != nil {
			return err
		}
		if enc := int32(binary.BigEndian.Uint32(rect[8:])); enc != 0 {
			return fmt.Errorf("rectangle encoding %d, want raw (0)", enc)
		}
		n := int64(binary.BigEndian.Uint16(rect[4:])) * int64(binary.BigEndian.Uint16(rect[6:])) * int64(bpp/8)
		if _, err := io.CopyN(io.Discard, rw, n); err != nil {
			return err
		}
	}
	return nil
}

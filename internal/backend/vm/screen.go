package vm

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"image"
	"image/png"
	"os"
	"strings"
	"time"

	"github.com/corral-dev/corral/internal/backend"
	"github.com/corral-dev/corral/internal/errdefs"
	"github.com/corral-dev/corral/internal/qmp"
)

// Screenshot implements backend.Screener: QMP screendump writes the
// VGA console as PNG into the run dir (QEMU writes only there), read back
// and, when asked, scaled down.
func (s *sandbox) Screenshot(ctx context.Context, scale float64) (backend.Screenshot, error) {
	var shot backend.Screenshot
	if scale < 0 || scale > 1 {
		return shot, errdefs.InvalidArgument("scale: %g must be in (0, 1] (0 means 1)", scale)
	}
	if err := s.Running(); err != nil {
		return shot, err
	}
	if s.Checkpointed() {
		return shot, errdefs.FailedPrecondition("sandbox %s: paused to a snapshot on disk: resume it first", s.m.id)
	}
	raw, err := s.screendump(ctx)
	if err != nil {
		return shot, err
	}
	img, err := png.Decode(bytes.NewReader(raw))
	if err != nil {
		return shot, fmt.Errorf("sandbox %s: screenshot: decode: %w", s.m.id, err)
	}
	if scale > 0 && scale < 1 {
		img = scaleDown(img, scale)
		var buf bytes.Buffer
		if err := png.Encode(&buf, img); err != nil {
			return shot, fmt.Errorf("sandbox %s: screenshot: %w", s.m.id, err)
		}
		raw = buf.Bytes()
	}
	b := img.Bounds()
	return backend.Screenshot{PNG: raw, Width: b.Dx(), Height: b.Dy()}, nil
}

func (s *sandbox) screendump(ctx context.Context) ([]byte, error) {
	var nonce [6]byte
	_, _ = rand.Read(nonce[:])
	p := s.m.path("screen-" + hex.EncodeToString(nonce[:]) + ".png")
	defer os.Remove(p)
	if _, err := qmpRun(ctx, s.m, "screendump", map[string]any{"filename": p, "format": "png"}); err != nil {
		return nil, fmt.Errorf("sandbox %s: screendump: %w", s.m.id, err)
	}
	raw, err := os.ReadFile(p)
	if err != nil {
		return nil, fmt.Errorf("sandbox %s: screendump: %w", s.m.id, err)
	}
	return raw, nil
}

// scaleDown resamples img by nearest neighbour.
func scaleDown(img image.Image, scale float64) image.Image {
	b := img.Bounds()
	w, h := max(1, int(float64(b.Dx())*scale)), max(1, int(float64(b.Dy())*scale))
	out := image.NewRGBA(image.Rect(0, 0, w, h))
	for y := 0; y < h; y++ {
		sy := b.Min.Y + y*b.Dy()/h
		for x := 0; x < w; x++ {
			out.Set(x, y, img.At(b.Min.X+x*b.Dx()/w, sy))
		}
	}
	return out
}

// qcodes of the US layout: the key for each printable character and
// whether it needs shift.
var charKeys = func() map[rune]struct {
	code  string
	shift bool
} {
	m := map[rune]struct {
		code  string
		shift bool
	}{}
	for c := 'a'; c <= 'z'; c++ {
		m[c] = struct {
			code  string
			shift bool
		}{string(c), false}
		m[c-'a'+'A'] = struct {
			code  string
			shift bool
		}{string(c), true}
	}
	plain := map[rune]string{'0': "0", '1': "1", '2': "2", '3': "3", '4': "4", '5': "5", '6': "6", '7': "7", '8': "8", '9': "9",
		' ': "spc", '\n': "ret", '\t': "tab", '-': "minus", '=': "equal", '[': "bracket_left", ']': "bracket_right",
		'\\': "backslash", ';': "semicolon", '\'': "apostrophe", '`': "grave_accent", ',': "comma", '.': "dot", '/': "slash"}
	shifted := map[rune]string{')': "0", '!': "1", '@': "2", '#': "3", '$': "4", '%': "5", '^': "6", '&': "7", '*': "8", '(': "9",
		'_': "minus", '+': "equal", '{': "bracket_left", '}': "bracket_right", '|': "backslash", ':': "semicolon",
		'"': "apostrophe", '~': "grave_accent", '<': "comma", '>': "dot", '?': "slash"}
	for r, c := range plain {
		m[r] = struct {
			code  string
			shift bool
		}{c, false}
	}
	for r, c := range shifted {
		m[r] = struct {
			code  string
			shift bool
		}{c, true}
	}
	return m
}()

// keyNames are the names a key combination may use besides single
// characters, as QEMU qcodes.
var keyNames = map[string]string{
	"ctrl": "ctrl", "control": "ctrl", "alt": "alt", "shift": "shift", "meta": "meta_l", "super": "meta_l", "win": "meta_l",
	"enter": "ret", "return": "ret", "esc": "esc", "escape": "esc", "tab": "tab", "space": "spc", "backspace": "backspace",
	"delete": "delete", "del": "delete", "insert": "insert", "home": "home", "end": "end", "pageup": "pgup", "pagedown": "pgdn",
	"up": "up", "down": "down", "left": "left", "right": "right",
	"f1": "f1", "f2": "f2", "f3": "f3", "f4": "f4", "f5": "f5", "f6": "f6", "f7": "f7", "f8": "f8", "f9": "f9", "f10": "f10",
	"f11": "f11", "f12": "f12",
}

// parseKeys turns "ctrl-alt-t" into qcodes.
func parseKeys(combo string) ([]string, error) {
	if combo == "" {
		return nil, errdefs.InvalidArgument("keys: empty")
	}
	parts := strings.Split(strings.ToLower(combo), "-")
	if strings.HasSuffix(combo, "--") { // "ctrl--": the minus key
		parts = append(parts[:len(parts)-2], "-")
	}
	var codes []string
	for _, p := range parts {
		if c, ok := keyNames[p]; ok {
			codes = append(codes, c)
			continue
		}
		if r := []rune(p); len(r) == 1 {
			if k, ok := charKeys[r[0]]; ok && !k.shift {
				codes = append(codes, k.code)
				continue
			}
		}
		return nil, errdefs.InvalidArgument("keys: %q: unknown key %q (names: ctrl, alt, shift, meta, enter, esc, tab, space, backspace, delete, arrows, f1-f12, or one character)", combo, p)
	}
	return codes, nil
}

func keyEvent(code string, down bool) map[string]any {
	return map[string]any{"type": "key", "data": map[string]any{"down": down, "key": map[string]any{"type": "qcode", "data": code}}}
}

func btnEvent(button string, down bool) map[string]any {
	return map[string]any{"type": "btn", "data": map[string]any{"down": down, "button": button}}
}

// absMax is the range of QEMU's absolute pointer axes.
const absMax = 0x7fff

// SendInput implements backend.Screener through input-send-event: keys
// on the PS/2 keyboard, pointer on the virtio tablet (absolute, scaled
// to the current screen size).
func (s *sandbox) SendInput(ctx context.Context, events []backend.InputEvent) error {
	if err := s.Serving(); err != nil {
		return err
	}
	var w, h int
	var qc *qmp.Client
	for i, ev := range events {
		var batches [][]map[string]any
		switch {
		case ev.Text != "":
			for _, r := range ev.Text {
				k, ok := charKeys[r]
				if !ok {
					return errdefs.InvalidArgument("events[%d].text: %q cannot be typed on a US keyboard", i, r)
				}
				var b []map[string]any
				if k.shift {
					b = append(b, keyEvent("shift", true))
				}
				b = append(b, keyEvent(k.code, true), keyEvent(k.code, false))
				if k.shift {
					b = append(b, keyEvent("shift", false))
				}
				batches = append(batches, b)
			}
		case ev.Keys != "":
			codes, err := parseKeys(ev.Keys)
			if err != nil {
				return fmt.Errorf("events[%d]: %w", i, err)
			}
			var b []map[string]any
			for _, c := range codes {
				b = append(b, keyEvent(c, true))
			}
			for j := len(codes) - 1; j >= 0; j-- {
				b = append(b, keyEvent(codes[j], false))
			}
			batches = append(batches, b)
		case ev.Move || ev.Click || ev.Scroll:
			if w == 0 {
				if qc != nil { // QEMU serves one QMP client at a time
					qc.Close()
					qc = nil
				}
				shot, err := s.Screenshot(ctx, 0)
				if err != nil {
					return err
				}
				w, h = shot.Width, shot.Height
			}
			if ev.X < 0 || ev.Y < 0 || ev.X >= w || ev.Y >= h {
				return errdefs.InvalidArgument("events[%d]: point %d,%d is outside the %dx%d screen", i, ev.X, ev.Y, w, h)
			}
			move := []map[string]any{
				{"type": "abs", "data": map[string]any{"axis": "x", "value": ev.X * absMax / max(1, w-1)}},
				{"type": "abs", "data": map[string]any{"axis": "y", "value": ev.Y * absMax / max(1, h-1)}},
			}
			batches = append(batches, move)
			switch {
			case ev.Click:
				btn := ev.Button
				if btn == "" {
					btn = "left"
				}
				if btn != "left" && btn != "right" && btn != "middle" {
					return errdefs.InvalidArgument("events[%d].button: %q must be left, right or middle", i, btn)
				}
				batches = append(batches, []map[string]any{btnEvent(btn, true)}, []map[string]any{btnEvent(btn, false)})
			case ev.Scroll:
				btn, n := "wheel-down", ev.ScrollDelta
				if n < 0 {
					btn, n = "wheel-up", -n
				}
				if n == 0 || n > 100 {
					return errdefs.InvalidArgument("events[%d].scroll_delta: %d must be between -100 and 100, not 0", i, ev.ScrollDelta)
				}
				for range n {
					batches = append(batches, []map[string]any{btnEvent(btn, true)}, []map[string]any{btnEvent(btn, false)})
				}
			}
		default:
			return errdefs.InvalidArgument("events[%d]: says nothing to do (text, keys, move, click or scroll)", i)
		}
		if qc == nil && len(batches) > 0 {
			var err error
			if qc, err = dialQMP(ctx, s.m, nil); err != nil {
				return fmt.Errorf("sandbox %s: input: %w", s.m.id, err)
			}
			defer qc.Close()
		}
		for _, b := range batches {
			if _, err := qc.Run(ctx, "input-send-event", map[string]any{"events": b}); err != nil {
				return fmt.Errorf("sandbox %s: input: %w", s.m.id, err)
			}
			// The guest's keyboard buffer is small: a slow (emulated)
			// guest drains it between keys.
			time.Sleep(15 * time.Millisecond)
		}
	}
	return nil
}

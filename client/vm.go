package client

import (
	"context"
	"io"
	"time"

	"connectrpc.com/connect"

	corralv1 "github.com/corral-dev/corral/api/corral/v1"
)

// VMImage is a disk image that sandboxes of backend "vm" boot.
type VMImage struct {
	Ref string // NAME@VERSION
	// Format is qcow2 or raw; Firmware bios, uefi or direct.
	Format, Firmware string
	VirtualSize      int64
	FileSize         int64
	Source           string
	Created          time.Time
	Node             string // the node holding it
}

func vmImageFromProto(p *corralv1.VMImage) VMImage {
	if p == nil {
		return VMImage{}
	}
	return VMImage{Ref: p.Ref, Format: p.Format, Firmware: p.Firmware, VirtualSize: p.VirtualSizeBytes,
		FileSize: p.FileSizeBytes, Source: p.Source, Created: time.Unix(p.CreatedUnix, 0), Node: p.Node}
}

// ListVMImages lists the node's VM images.
func (c *Client) ListVMImages(ctx context.Context) ([]VMImage, error) {
	return c.VMImagesOn("").List(ctx)
}

// VMImageNode aims VM image calls at one node of a cluster: VM images are
// each node's own. The empty node is every node for List and, for the
// others, the only node running the vm backend (a single server is that).
type VMImageNode struct {
	c    *Client
	node string
}

// VMImagesOn is the VM image calls of node.
func (c *Client) VMImagesOn(node string) VMImageNode { return VMImageNode{c: c, node: node} }

// List lists the node's VM images.
func (n VMImageNode) List(ctx context.Context) ([]VMImage, error) {
	resp, err := n.c.vm.ListVMImages(ctx, connect.NewRequest(&corralv1.ListVMImagesRequest{Node: n.node}))
	if err != nil {
		return nil, wrapErr(err)
	}
	return fromProtos(resp.Msg.Images, vmImageFromProto), nil
}

// ImportVMImage streams a qcow2 or raw disk from r to the node as name
// (NAME@VERSION); firmware is "bios" or "uefi".
func (c *Client) ImportVMImage(ctx context.Context, r io.Reader, name, firmware string) (VMImage, error) {
	return c.VMImagesOn("").Import(ctx, r, name, firmware)
}

// Import streams a disk to the node as ImportVMImage does.
func (n VMImageNode) Import(ctx context.Context, r io.Reader, name, firmware string) (VMImage, error) {
	resp, err := upload(ctx, func(ctx context.Context) clientStream[corralv1.ImportVMImageRequest, corralv1.ImportVMImageResponse] {
		return n.c.vm.ImportVMImage(ctx)
	}, &corralv1.ImportVMImageRequest{Name: name, Firmware: firmware, Node: n.node}, r,
		func(m *corralv1.ImportVMImageRequest) *[]byte { return &m.Data })
	if err != nil {
		return VMImage{}, err
	}
	return vmImageFromProto(resp.Image), nil
}

// BuildVMImage builds recipe ("debian") on the node as name (empty:
// debian@12); progress, when set, gets each progress line.
func (c *Client) BuildVMImage(ctx context.Context, recipe, name string, progress func(string)) (VMImage, error) {
	return c.VMImagesOn("").Build(ctx, recipe, name, progress)
}

// Build builds an image on the node as BuildVMImage does.
func (n VMImageNode) Build(ctx context.Context, recipe, name string, progress func(string)) (VMImage, error) {
	stream, err := n.c.vm.BuildVMImage(ctx, connect.NewRequest(&corralv1.BuildVMImageRequest{Recipe: recipe, Name: name, Node: n.node}))
	if err != nil {
		return VMImage{}, wrapErr(err)
	}
	return streamResult(stream, func(m *corralv1.BuildVMImageResponse) (VMImage, bool) {
		if m.Image != nil {
			return vmImageFromProto(m.Image), true
		}
		if progress != nil {
			progress(m.Progress)
		}
		return VMImage{}, false
	}, "build vm image")
}

// RemoveVMImage removes a VM image no sandbox uses.
func (c *Client) RemoveVMImage(ctx context.Context, ref string) error {
	return c.VMImagesOn("").Remove(ctx, ref)
}

// Remove removes an image from the node as RemoveVMImage does.
func (n VMImageNode) Remove(ctx context.Context, ref string) error {
	_, err := n.c.vm.RemoveVMImage(ctx, connect.NewRequest(&corralv1.RemoveVMImageRequest{Ref: ref, Node: n.node}))
	return wrapErr(err)
}

// Screenshot is a PNG of a vm sandbox's screen.
type Screenshot struct {
	PNG           []byte
	Width, Height int
}

// Screenshot captures a vm sandbox's screen; scale in (0, 1] shrinks it
// (0 keeps the full size).
func (c *Client) Screenshot(ctx context.Context, sandboxID string, scale float64) (Screenshot, error) {
	resp, err := c.vm.Screenshot(ctx, connect.NewRequest(&corralv1.ScreenshotRequest{SandboxId: sandboxID, Scale: scale}))
	if err != nil {
		return Screenshot{}, wrapErr(err)
	}
	return Screenshot{PNG: resp.Msg.Png, Width: int(resp.Msg.Width), Height: int(resp.Msg.Height)}, nil
}

// InputEvent is one keyboard or mouse action; set exactly one of Text,
// Keys, Move, Click or Scroll.
type InputEvent struct {
	Text string // characters to type (US layout)
	Keys string // a combination such as "ctrl-alt-t" or "enter"
	// Move, Click and Scroll act at X, Y (screen pixels); Button is left
	// (default), right or middle; ScrollDelta notches, positive down.
	Move, Click, Scroll bool
	X, Y                int
	Button              string
	ScrollDelta         int
}

// TypeText, PressKeys and ClickAt are the common events.
func TypeText(s string) InputEvent      { return InputEvent{Text: s} }
func PressKeys(combo string) InputEvent { return InputEvent{Keys: combo} }
func ClickAt(x, y int) InputEvent       { return InputEvent{Click: true, X: x, Y: y} }

// SendInput delivers events to a vm sandbox in order.
func (c *Client) SendInput(ctx context.Context, sandboxID string, events ...InputEvent) error {
	req := &corralv1.SendInputRequest{SandboxId: sandboxID}
	for _, e := range events {
		req.Events = append(req.Events, &corralv1.InputEvent{Text: e.Text, Keys: e.Keys, Move: e.Move, Click: e.Click,
			Scroll: e.Scroll, X: int32(e.X), Y: int32(e.Y), Button: e.Button, ScrollDelta: int32(e.ScrollDelta)})
	}
	_, err := c.vm.SendInput(ctx, connect.NewRequest(req))
	return wrapErr(err)
}

package client

import (
	"context"
	"io"

	"connectrpc.com/connect"

	corralv1 "github.com/corral-dev/corral/api/corral/v1"
)

// BuildOptions configure BuildImage.
type BuildOptions struct {
	// Rebuild builds afresh and replaces an existing image (only while no
	// sandbox uses it); otherwise an existing image is returned as it is.
	Rebuild bool
	// Output receives the build's output as the server streams it (nil:
	// dropped).
	Output io.Writer
}

// BuildImage has the server build a built-in image (busybox, debian) from
// its recipe into its own store. Only the node administrator may (root on
// the server's unix socket); a debian build takes about a minute.
func (c *Client) BuildImage(ctx context.Context, name string, o BuildOptions) (*BuiltImage, error) {
	stream, err := c.img.BuildImage(ctx, connect.NewRequest(&corralv1.BuildImageRequest{Name: name, Rebuild: o.Rebuild}))
	if err != nil {
		return nil, wrapErr(err)
	}
	return streamResult(stream, func(m *corralv1.BuildImageResponse) (*BuiltImage, bool) {
		switch ev := m.Event.(type) {
		case *corralv1.BuildImageResponse_Output:
			if o.Output != nil {
				_, _ = io.WriteString(o.Output, ev.Output) // a progress display only
			}
		case *corralv1.BuildImageResponse_Image:
			b := ev.Image
			return &BuiltImage{Name: b.Name, Layers: layersFromProto(b.Layers), Env: b.Env}, true
		}
		return nil, false
	}, "corral client: build "+name)
}

package cli

import (
	"fmt"
	"strings"
	"time"

	"github.com/spf13/cobra"
)

// newLiveViewCmd is `corral live-view ID`: a one-time token for the vm
// sandbox's screen as VNC over a websocket.
func newLiveViewCmd(g *globals) *cobra.Command {
	var ttl time.Duration
	cmd := &cobra.Command{
		Use:   "live-view ID",
		Short: "Print a one-time websocket URL to a vm sandbox's screen (VNC)",
		Long: `Print a one-time websocket URL to a vm sandbox's screen, keyboard and mouse:
VNC (RFB) over a websocket on the server's API listener. The token opens one
connection, within --ttl; any VNC client that speaks websockets (noVNC) can use it.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := g.client()
			if err != nil {
				return err
			}
			lv, err := c.LiveView(cmd.Context(), args[0], ttl)
			if err != nil {
				return err
			}
			url := lv.URLPath()
			switch {
			case strings.HasPrefix(g.addr, "http://"):
				url = "ws://" + strings.TrimSuffix(strings.TrimPrefix(g.addr, "http://"), "/") + url
			case strings.HasPrefix(g.addr, "https://"):
				url = "wss://" + strings.TrimSuffix(strings.TrimPrefix(g.addr, "https://"), "/") + url
			}
			if g.json {
				return printJSON(map[string]any{"path": lv.Path, "token": lv.Token, "expires": lv.Expires.UTC().Format(time.RFC3339), "url": url})
			}
			fmt.Println(url)
			return nil
		},
	}
	cmd.Flags().DurationVar(&ttl, "ttl", time.Minute, "how long the token waits for its connection (at most 1h)")
	return cmd
}

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
connection, within --ttl; any VNC client that speaks websockets (noVNC) can use it.
On a TCP address it also prints the dashboard's viewer page (/ui/liveview.html)
for that token: open it in a browser.`,
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
			// On TCP, also the dashboard's viewer page, with the token in
			// the URL's fragment (never sent to a server).
			url, page := lv.URLPath(), ""
			for _, sc := range []struct{ http, ws string }{{"http://", "ws://"}, {"https://", "wss://"}} {
				if host, ok := strings.CutPrefix(g.addr, sc.http); ok {
					host = strings.TrimSuffix(host, "/")
					url = sc.ws + host + url
					page = sc.http + host + "/ui/liveview.html#path=" + lv.Path + "&token=" + lv.Token
				}
			}
			if g.json {
				return printJSON(map[string]any{"path": lv.Path, "token": lv.Token, "expires": lv.Expires.UTC().Format(time.RFC3339), "url": url, "page": page})
			}
			fmt.Println(url)
			if page != "" {
				fmt.Println(page)
			}
			return nil
		},
	}
	cmd.Flags().DurationVar(&ttl, "ttl", time.Minute, "how long the token waits for its connection (at most 1h)")
	return cmd
}

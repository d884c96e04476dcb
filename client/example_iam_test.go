package client_test

import (
	"context"
	"fmt"
	"strings"

	"github.com/corral-dev/corral/client"
)

// As the node administrator (the unix socket), make a project with a quota,
// a subproject with part of it and a token for the subproject; a harness
// then connects over TCP with client.New("host:7070", client.WithToken(secret))
// or CORRAL_TOKEN.
func Example_projects() {
	ctx := context.Background()
	c, _ := client.New(addr)
	defer c.Close()
	if _, err := c.CreateProject(ctx, "job42", client.Quota{MaxSandboxes: 8}); err != nil {
		fmt.Println(err)
		return
	}
	defer c.DeleteProject(ctx, "job42", false)
	if _, err := c.CreateProject(ctx, "job42/agent7", client.Quota{MaxSandboxes: 10}); err != nil {
		fmt.Println(err) // more than job42 has
	}
	if _, err := c.CreateProject(ctx, "job42/agent7", client.Quota{MaxSandboxes: 4}); err != nil {
		fmt.Println(err)
		return
	}
	tok, secret, err := c.CreateToken(ctx, client.TokenOptions{Project: "job42/agent7", Role: "member"})
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println(tok.Project, tok.Role, strings.HasPrefix(secret, "corral_"+tok.ID+"_"))
	p, _ := c.GetProject(ctx, "job42")
	fmt.Println(p.Quota.MaxSandboxes, p.Delegated.MaxSandboxes)
	// Output:
	// resource_exhausted: project job42: quota max_sandboxes: job42/agent7 asks 10 but job42 has 8 left (limit 8, 0 given to other subprojects)
	// job42/agent7 member true
	// 8 4
}

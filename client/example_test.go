package client_test

import (
	"bytes"
	"context"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"testing"

	"github.com/corral-dev/corral/client"
	"github.com/corral-dev/corral/internal/testenv"
)

// addr is the live server the examples talk to, started by TestMain.
var addr string

const needRoot = "client examples: need root to start a server (namespaces, cgroups, mounts)"

func TestMain(m *testing.M) {
	if os.Geteuid() != 0 {
		// An example cannot skip itself: run only the test that says why,
		// so the run reports a skip instead of a pass.
		flag.Parse()
		_ = flag.Set("test.run", "^TestExamplesHaveAServer$")
		os.Exit(m.Run())
	}
	srv, err := testenv.Start(slog.New(slog.DiscardHandler))
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	addr = srv.Addr
	code := m.Run()
	if err := srv.Stop(); err != nil {
		fmt.Fprintln(os.Stderr, "stop server:", err)
		code = 1
	}
	testenv.RemoveCgroupParent(srv.Config.CgroupParent)
	os.RemoveAll(srv.Config.DataDir)
	os.Exit(code)
}

// TestExamplesHaveAServer skips, with the reason, where the examples
// cannot run; elsewhere it checks that TestMain started their server.
func TestExamplesHaveAServer(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip(needRoot)
	}
	if addr == "" {
		t.Fatal("no server address for the examples")
	}
}

// Create a sandbox, run a command in it and delete it.
func Example() {
	ctx := context.Background()
	c, err := client.New(addr)
	if err != nil {
		panic(err)
	}
	defer c.Close()
	sb, err := c.Create(ctx, client.CreateOptions{Image: "busybox"})
	if err != nil {
		panic(err)
	}
	defer sb.Delete(ctx)
	res, err := sb.Run(ctx, client.Command{Shell: "echo hello from $(hostname)"})
	if err != nil {
		panic(err)
	}
	fmt.Print(string(res.Stdout))
	fmt.Println("exit code", res.ExitCode)
	// Output:
	// hello from sandbox
	// exit code 0
}

// Stream a command's output as it runs.
func ExampleSandbox_Exec() {
	ctx := context.Background()
	c, _ := client.New(addr)
	defer c.Close()
	sb, err := c.Create(ctx, client.CreateOptions{})
	if err != nil {
		panic(err)
	}
	defer sb.Delete(ctx)
	var out bytes.Buffer
	res, err := sb.Exec(ctx, client.Command{Args: []string{"seq", "3"}, Stdout: &out})
	if err != nil {
		panic(err)
	}
	fmt.Print(out.String())
	fmt.Println("exit code", res.ExitCode)
	// Output:
	// 1
	// 2
	// 3
	// exit code 0
}

// Move files in and out of a sandbox.
func ExampleSandbox_Files() {
	ctx := context.Background()
	c, _ := client.New(addr)
	defer c.Close()
	sb, err := c.Create(ctx, client.CreateOptions{})
	if err != nil {
		panic(err)
	}
	defer sb.Delete(ctx)
	if err := sb.Files().Write(ctx, "/work/input.txt", []byte("3 4\n")); err != nil {
		panic(err)
	}
	if _, err := sb.Run(ctx, client.Command{Shell: "read a b < /work/input.txt; echo $((a*b)) > /work/out.txt"}); err != nil {
		panic(err)
	}
	data, err := sb.Files().Read(ctx, "/work/out.txt")
	if err != nil {
		panic(err)
	}
	fmt.Print(string(data))
	entries, _ := sb.Files().List(ctx, "/work")
	for _, e := range entries {
		fmt.Println(e.Name, e.Size)
	}
	// Output:
	// 12
	// input.txt 4
	// out.txt 3
}

// Errors carry the server's code and a message naming the field.
func ExampleIsInvalidArgument() {
	c, _ := client.New(addr)
	defer c.Close()
	_, err := c.Create(context.Background(), client.CreateOptions{Resources: client.Resources{MemoryBytes: -1}})
	fmt.Println(client.IsInvalidArgument(err))
	// Output: true
}

// A sandbox that reaches PyPI and one HTTPS host and nothing else, opened
// to npm for the next stage of its task. (Not run here: it needs a node
// whose network reaches those hosts.)
func ExampleSandbox_UpdateNetwork() {
	ctx := context.Background()
	c, err := client.New(addr)
	if err != nil {
		panic(err)
	}
	defer c.Close()
	sb, err := c.Create(ctx, client.CreateOptions{Image: "debian",
		Network: client.Network{Mode: client.NetworkAllowlist, Allow: []string{"pypi", "example.org:443"}}})
	if err != nil {
		panic(err)
	}
	defer sb.Delete(ctx)
	// ... pip install ...
	nw, err := sb.UpdateNetwork(ctx, client.NetworkUpdate{Allow: []string{"npm"}, Deny: []string{"pypi"}})
	if err != nil {
		panic(err)
	}
	fmt.Println(nw.Mode, nw.Allow) // in force now
	st, err := sb.NetworkStats(ctx)
	if err != nil {
		panic(err)
	}
	for _, r := range st.Refusals {
		fmt.Println(r.Count, r.Hook, r.Protocol, r.Address, r.Port, r.Name)
	}
}

// Branch a trajectory: pack a sandbox's writes as a layer and start two
// sandboxes from where it is.
func ExampleSandbox_Pack() {
	ctx := context.Background()
	c, _ := client.New(addr)
	defer c.Close()
	sb, err := c.Create(ctx, client.CreateOptions{Image: "busybox"})
	if err != nil {
		panic(err)
	}
	defer sb.Delete(ctx)
	if _, err := sb.Run(ctx, client.Command{Shell: "mkdir /work && echo step-k > /work/state && echo noise > /tmp/x"}); err != nil {
		panic(err)
	}
	packed, err := sb.Pack(ctx, "example-branch@1", client.PackOptions{})
	if err != nil {
		panic(err)
	}
	fmt.Println(packed.Composition.Layers)
	for range 2 {
		br, err := c.Create(ctx, client.CreateOptions{Image: packed.Composition.Ref})
		if err != nil {
			panic(err)
		}
		res, _ := br.Run(ctx, client.Command{Shell: "cat /work/state; ls /tmp | wc -l"})
		fmt.Print(string(res.Stdout))
		br.Delete(ctx)
	}
	// Output:
	// [busybox@1 example-branch@1]
	// step-k
	// 0
	// step-k
	// 0
}

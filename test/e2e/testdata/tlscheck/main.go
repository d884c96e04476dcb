// Command tlscheck serves TLS on loopback with the certificate and key
// given, then connects to itself trusting only the system's roots (as any
// program in the sandbox would), and prints "verified" or why not.
package main

import (
	"crypto/tls"
	"fmt"
	"net"
	"os"
)

func main() {
	if len(os.Args) != 4 {
		fmt.Fprintln(os.Stderr, "usage: tlscheck CERT KEY SERVERNAME")
		os.Exit(2)
	}
	cert, err := tls.LoadX509KeyPair(os.Args[1], os.Args[2])
	if err != nil {
		fmt.Println("load:", err)
		os.Exit(1)
	}
	ln, err := tls.Listen("tcp", "127.0.0.1:0", &tls.Config{Certificates: []tls.Certificate{cert}})
	if err != nil {
		fmt.Println("listen:", err)
		os.Exit(1)
	}
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func(c net.Conn) {
				defer c.Close()
				_ = c.(*tls.Conn).Handshake()
			}(c)
		}
	}()
	c, err := tls.Dial("tcp", ln.Addr().String(), &tls.Config{ServerName: os.Args[3]})
	if err != nil {
		fmt.Println("dial:", err)
		os.Exit(1)
	}
	c.Close()
	fmt.Println("verified")
}

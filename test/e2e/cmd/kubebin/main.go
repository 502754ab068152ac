// Command kubebin builds the e2e cluster's binaries into the cache (see
// package kubebin) and prints their paths. make e2e runs it before the
// tests, whose output go test holds back until a package ends, so a
// fresh build's progress shows as it happens.
//
//	cd test/e2e && go run ./cmd/kubebin [name ...]
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/xdpq/xdpq/test/e2e/kubebin"
)

func main() {
	node := flag.Bool("node", false, fmt.Sprintf("build the node's binaries only: %v", kubebin.Node()))
	flag.Usage = func() {
		fmt.Fprintf(os.Stderr, "usage: kubebin [-node] [name ...]\n\nBuilds into %s ($%s) the named binaries, all by default: %v\n",
			kubebin.CacheDir(), kubebin.CacheEnv, kubebin.All())
		flag.PrintDefaults()
	}
	flag.Parse()
	names := flag.Args()
	switch {
	case *node && len(names) > 0:
		fmt.Fprintln(os.Stderr, "kubebin: -node or names, not both")
		os.Exit(2)
	case *node:
		names = kubebin.Node()
	case len(names) == 0:
		names = kubebin.All()
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	paths, err := kubebin.Ensure(ctx, kubebin.Options{}, names...)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	for _, n := range names {
		fmt.Println(paths[n])
	}
}

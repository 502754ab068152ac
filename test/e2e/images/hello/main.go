// Command hello is the e2e tests' workload image: it prints "hello" and
// its arguments and exits 0, or with -wait waits for SIGTERM first (a
// pod that stays Running).
package main

import (
	"flag"
	"fmt"
	"os"
	"os/signal"
	"strings"
	"syscall"
)

func main() {
	wait := flag.Bool("wait", false, "wait for SIGTERM or SIGINT before exiting")
	flag.Parse()
	fmt.Println(strings.Join(append([]string{"hello"}, flag.Args()...), " "))
	if *wait {
		sigs := make(chan os.Signal, 1)
		signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM)
		<-sigs
	}
}

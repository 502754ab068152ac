// Command hello is a Go hello world: the floor of a Go binary's exec.
package main

import "os"

func main() { _, _ = os.Stdout.WriteString("{}\n") }

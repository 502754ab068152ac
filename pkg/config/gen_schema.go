//go:build ignore

// Writes docs/config.schema.json; run by `go generate ./pkg/config`.
package main

import (
	"log"
	"os"

	"github.com/xdpq/xdpq/pkg/config"
)

func main() {
	b, err := config.Schema()
	if err != nil {
		log.Fatal(err)
	}
	if err := os.WriteFile("../../docs/config.schema.json", b, 0o644); err != nil {
		log.Fatal(err)
	}
}

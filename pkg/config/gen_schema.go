//go:build ignore

// Writes docs/config.schema.json, and the same schema into the Helm
// chart's values.schema.json as $defs.config (the chart's `config` value
// is the daemon's config file); run by `go generate ./pkg/config`.
package main

import (
	"log"
	"os"

	"github.com/xdpq/xdpq/pkg/config"
)

const valuesSchema = "../../charts/xdpq/values.schema.json"

func main() {
	b, err := config.Schema()
	if err != nil {
		log.Fatal(err)
	}
	if err := os.WriteFile("../../docs/config.schema.json", b, 0o644); err != nil {
		log.Fatal(err)
	}
	values, err := os.ReadFile(valuesSchema)
	if err != nil {
		log.Fatal(err)
	}
	values, err = config.EmbedSchema(values)
	if err != nil {
		log.Fatalf("%s: %v", valuesSchema, err)
	}
	if err := os.WriteFile(valuesSchema, values, 0o644); err != nil {
		log.Fatal(err)
	}
}

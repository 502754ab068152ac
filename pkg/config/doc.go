// Package config is xdpq's pool configuration: its schema, its
// validation with errors that name the field, and its reload when the file
// changes or when the program asks (cmd/deviceplugin: on SIGHUP).
//
// A config lists pools. A pool is a resource (`xdpq.io/<name>`): the
// queues it reserves on the netdevs its selectors match, how flows are
// steered to them, and what one pod may ask for. Per-node overrides replace
// pools by name on the nodes they select. The JSON Schema of the file is
// generated from these types (docs/config.schema.json).
package config

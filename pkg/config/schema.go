package config

import (
	"encoding/json"
	"fmt"
	"reflect"
	"strings"
)

// Schema returns the JSON Schema (draft 2020-12) of the config file,
// generated from the Go types and their `desc` and `enum` tags.
func Schema() ([]byte, error) {
	s := typeSchema(reflect.TypeOf(Config{}))
	s["$schema"] = "https://json-schema.org/draft/2020-12/schema"
	s["$id"] = "https://xdpq.io/config.schema.json"
	s["title"] = "xdpq pool configuration"
	b, err := json.MarshalIndent(s, "", "  ")
	return append(b, '\n'), err
}

func typeSchema(t reflect.Type) map[string]any {
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	switch {
	case t == reflect.TypeOf(Duration{}):
		return map[string]any{"type": "string", "pattern": `^([0-9]+(\.[0-9]+)?(ns|us|µs|ms|s|m|h))+$`}
	case t.Kind() == reflect.String:
		return map[string]any{"type": "string"}
	case t.Kind() == reflect.Bool:
		return map[string]any{"type": "boolean"}
	case t.Kind() >= reflect.Int && t.Kind() <= reflect.Int64:
		return map[string]any{"type": "integer"}
	case t.Kind() >= reflect.Uint && t.Kind() <= reflect.Uint64:
		return map[string]any{"type": "integer", "minimum": 0}
	case t.Kind() == reflect.Slice:
		return map[string]any{"type": "array", "items": typeSchema(t.Elem())}
	case t.Kind() == reflect.Map:
		return map[string]any{"type": "object", "additionalProperties": typeSchema(t.Elem())}
	}
	props := map[string]any{}
	var required []string
	for i := range t.NumField() {
		f := t.Field(i)
		name, opts, _ := strings.Cut(f.Tag.Get("json"), ",")
		if name == "" || name == "-" {
			continue
		}
		p := typeSchema(f.Type)
		if d := f.Tag.Get("desc"); d != "" {
			p["description"] = d
		}
		if e := f.Tag.Get("enum"); e != "" {
			p["enum"] = strings.Split(e, ",")
		}
		props[name] = p
		if !strings.Contains(opts, "omitempty") {
			required = append(required, name)
		}
	}
	s := map[string]any{"type": "object", "properties": props, "additionalProperties": false}
	if len(required) > 0 {
		s["required"] = required
	}
	return s
}

// EmbedSchema returns the JSON Schema document doc (the Helm chart's
// values.schema.json) with Schema put in as its $defs.config, without
// Schema's $schema and $id (the document has its own), so that the
// chart's config value is checked by the daemon's own schema. doc's
// other parts are kept; the result is indented as Schema's is, with keys
// in order.
func EmbedSchema(doc []byte) ([]byte, error) {
	var d map[string]any
	if err := json.Unmarshal(doc, &d); err != nil {
		return nil, fmt.Errorf("embed the config schema: %w", err)
	}
	b, err := Schema()
	if err != nil {
		return nil, err
	}
	var s map[string]any
	if err := json.Unmarshal(b, &s); err != nil {
		return nil, err
	}
	delete(s, "$schema")
	delete(s, "$id")
	defs, _ := d["$defs"].(map[string]any)
	if defs == nil {
		defs = map[string]any{}
	}
	defs["config"] = s
	d["$defs"] = defs
	out, err := json.MarshalIndent(d, "", "  ")
	return append(out, '\n'), err
}

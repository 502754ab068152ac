package dra

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"

	resourceapi "k8s.io/api/resource/v1"

	"github.com/xdpq/xdpq/pkg/flow"
)

// The opaque configuration a DeviceClass or a claim gives driver xdpq.io.
const (
	ConfigAPIVersion = "xdpq.io/v1alpha1"
	ConfigKind       = "QueueConfig"
)

// QueueConfig is the claim's configuration of its queues:
//
//	config:
//	- opaque:
//	    driver: xdpq.io
//	    parameters:
//	      apiVersion: xdpq.io/v1alpha1
//	      kind: QueueConfig
//	      flows:
//	      - {protocol: udp, destinationPort: "2152"}
//
// Flows have the schema of the CNI configuration's "flows": a
// destination that is empty or "ipam" is each of the pod's own
// addresses, any other must be one of them (or one the pool's
// sharedDestinations grant). A DeviceClass's config gives defaults; a
// claim's replaces them field by field (a claim's flows replace the
// class's whole).
type QueueConfig struct {
	APIVersion string          `json:"apiVersion"`
	Kind       string          `json:"kind"`
	Flows      json.RawMessage `json:"flows,omitempty"`
}

// ConfigError is a configuration the driver refuses: Field names what
// is wrong as a user writes it (e.g. "flows[0].destinationPort").
type ConfigError struct {
	Source string // "class" or "claim"
	Index  int    // which of the allocation's configs
	Field  string
	Reason string
}

func (e *ConfigError) Error() string {
	return fmt.Sprintf("%s config %d for driver %s (%s %s): %s: %s", e.Source, e.Index, DriverName, ConfigAPIVersion, ConfigKind, e.Field, e.Reason)
}

// decodeConfig decodes and checks one opaque configuration.
func decodeConfig(raw []byte) (QueueConfig, string, error) {
	var c QueueConfig
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&c); err != nil {
		return c, fieldOf(err), err
	}
	if dec.More() {
		return c, "parameters", fmt.Errorf("more than one JSON value")
	}
	if c.APIVersion != ConfigAPIVersion {
		return c, "apiVersion", fmt.Errorf("%q: %s", c.APIVersion, ConfigAPIVersion)
	}
	if c.Kind != ConfigKind {
		return c, "kind", fmt.Errorf("%q: %s", c.Kind, ConfigKind)
	}
	if len(c.Flows) > 0 && !bytes.Equal(bytes.TrimSpace(c.Flows), []byte("null")) {
		if _, err := flow.ParseList(c.Flows, "flows"); err != nil {
			var fe *flow.FieldError
			if errors.As(err, &fe) {
				return c, fe.Field, fmt.Errorf("%s", fe.Details)
			}
			return c, "flows", err
		}
	} else {
		c.Flows = nil
	}
	return c, "", nil
}

// fieldOf names the field a JSON decoding error is about.
func fieldOf(err error) string {
	var te *json.UnmarshalTypeError
	if errors.As(err, &te) && te.Field != "" {
		return te.Field
	}
	if f, ok := strings.CutPrefix(err.Error(), "json: unknown field "); ok && strings.Trim(f, `"`) != "" {
		return strings.Trim(f, `"`)
	}
	return "parameters"
}

// ClaimConfig is the configuration in force for the requests of a
// claim that xdpq serves: the class's configs first, then the claim's,
// each replacing what the earlier set, as Kubernetes orders them in the
// claim's allocation.
func ClaimConfig(claim *resourceapi.ResourceClaim, requests []string) (QueueConfig, error) {
	var out QueueConfig
	if claim.Status.Allocation == nil {
		return out, nil
	}
	for i, c := range claim.Status.Allocation.Devices.Config {
		if c.Opaque == nil || c.Opaque.Driver != DriverName {
			continue
		}
		if len(c.Requests) > 0 && !slices.ContainsFunc(requests, func(r string) bool { return applies(c.Requests, r) }) {
			continue
		}
		source := "claim"
		if c.Source == resourceapi.AllocationConfigSourceClass {
			source = "class"
		}
		qc, field, err := decodeConfig(c.Opaque.Parameters.Raw)
		if err != nil {
			return out, &ConfigError{Source: source, Index: i, Field: field, Reason: err.Error()}
		}
		if qc.Flows != nil {
			out.Flows = qc.Flows
		}
	}
	out.APIVersion, out.Kind = ConfigAPIVersion, ConfigKind
	return out, nil
}

// applies says whether a config naming requests applies to request r
// ("req" or "req/subrequest"): a config for "req" applies to its
// subrequests.
func applies(requests []string, r string) bool {
	for _, q := range requests {
		if q == r || len(r) > len(q) && r[:len(q)] == q && r[len(q)] == '/' {
			return true
		}
	}
	return false
}

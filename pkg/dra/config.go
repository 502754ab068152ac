package dra

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"
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
	// Interface is how a netdev-mode pool's netdev is in the pod; a
	// queue pool's claim may not give it (its netdev stays the node's).
	Interface *InterfaceConfig `json:"interface,omitempty"`
}

// InterfaceConfig is a netdev-mode pool's netdev in the pod:
//
//	interface:
//	  name: net1                  # default: the netdev's name on the node
//	  mtu: 9000                   # default: as it is
//	  addresses: [192.0.2.7/24]   # default: none
type InterfaceConfig struct {
	Name      string   `json:"name,omitempty"`
	MTU       int      `json:"mtu,omitempty"`
	Addresses []string `json:"addresses,omitempty"`
}

// check says which field of the interface is wrong, and why.
func (c *InterfaceConfig) check() (string, error) {
	if c.Name != "" {
		if len(c.Name) > 15 || c.Name == "." || c.Name == ".." || strings.ContainsAny(c.Name, "/: \t\n\x00") {
			return "interface.name", fmt.Errorf("%q is not a Linux interface name (at most 15 bytes, no '/', ':' or white space)", c.Name)
		}
	}
	if c.MTU != 0 && (c.MTU < 68 || c.MTU > 65535) {
		return "interface.mtu", fmt.Errorf("%d is outside 68-65535", c.MTU)
	}
	for i, a := range c.Addresses {
		if _, err := netip.ParsePrefix(a); err != nil {
			return fmt.Sprintf("interface.addresses[%d]", i), fmt.Errorf("%q is not an address with its prefix length (192.0.2.7/24, 2001:db8::7/64)", a)
		}
	}
	return "", nil
}

// Prefixes are the interface's addresses.
func (c *InterfaceConfig) Prefixes() []netip.Prefix {
	var out []netip.Prefix
	for _, a := range c.Addresses {
		if p, err := netip.ParsePrefix(a); err == nil {
			out = append(out, p)
		}
	}
	return out
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
	// Go's decoder matches keys whatever their case; Kubernetes does
	// not, and neither does the driver.
	if field, err := exactKeys(raw, "", "apiVersion", "kind", "flows", "interface"); err != nil {
		return c, field, err
	}
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
	if c.Interface != nil {
		if field, err := c.Interface.check(); err != nil {
			return c, field, err
		}
	}
	return c, "", nil
}

// exactKeys refuses a JSON object with a key not spelled as one of
// keys (its "interface" too); raw that is no object is left to the
// decoder to refuse.
func exactKeys(raw []byte, prefix string, keys ...string) (string, error) {
	var m map[string]json.RawMessage
	if json.Unmarshal(raw, &m) != nil {
		return "", nil
	}
	for k, v := range m {
		if !slices.Contains(keys, k) {
			if k == "" {
				k = `""`
			}
			return prefix + k, fmt.Errorf("unknown field (field names are case-sensitive: %s)", strings.Join(keys, ", "))
		}
		if prefix == "" && k == "interface" {
			if field, err := exactKeys(v, "interface.", "name", "mtu", "addresses"); err != nil {
				return field, err
			}
		}
	}
	return "", nil
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
		if qc.Interface != nil {
			out.Interface = qc.Interface
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

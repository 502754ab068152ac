package cni

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"sort"
	"strings"

	"github.com/containernetworking/cni/pkg/types"
	"github.com/containernetworking/cni/pkg/version"
	"github.com/xdpq/xdpq/pkg/flow"
)

// ErrInvalidField is the CNI error code (plugin-specific, ≥ 100) of a
// configuration field that is unknown or invalid.
const ErrInvalidField = 100

// SupportedVersions are the CNI spec versions the plugin speaks.
var SupportedVersions = version.PluginSupports("0.4.0", "1.0.0", "1.1.0")

// NetConf is the plugin's network configuration.
type NetConf struct {
	types.NetConf
	// ResourceName is the pool's resource, e.g. xdpq.io/upf; Multus finds
	// the pod's devices of it.
	ResourceName string `json:"resourceName,omitempty"`
	// Flows are steered to the pod's queues.
	Flows []Flow `json:"flows,omitempty"`
	// DeviceID is the device (queue) the pod got; Multus puts it here or
	// in runtimeConfig.deviceID.
	DeviceID      string        `json:"deviceID,omitempty"`
	MTU           int           `json:"mtu,omitempty"`
	DaemonSocket  string        `json:"daemonSocket,omitempty"`
	RuntimeConfig RuntimeConfig `json:"runtimeConfig,omitempty"`
}

// RuntimeConfig holds what the runtime (or Multus) injects.
type RuntimeConfig struct {
	DeviceID string `json:"deviceID,omitempty"`
}

// Flow is traffic the pod wants (package flow).
type Flow = flow.Flow

// ParsedFlow is a Flow checked and with its ports expanded.
type ParsedFlow = flow.Parsed

// MaxPortRange is the widest port range a flow may name: each port is a
// rule of its own.
const MaxPortRange = flow.MaxPortRange

// parseFlow is flow.Parse with its error a CNI error.
func parseFlow(f Flow, field string) (ParsedFlow, error) {
	pf, err := flow.Parse(f, field)
	return pf, cniError(err)
}

// cniError makes a flow's field error a CNI error.
func cniError(err error) error {
	var fe *flow.FieldError
	if errors.As(err, &fe) {
		return fieldError(fe.Field, "%s", fe.Details)
	}
	return err
}

// fieldError is the CNI error of one field.
func fieldError(field, format string, args ...any) *types.Error {
	return &types.Error{Code: ErrInvalidField, Msg: "invalid network configuration: " + field,
		Details: fmt.Sprintf(format, args...)}
}

// knownFields are the top-level fields a configuration may have: the
// plugin's own and those the CNI spec and runtimes (Multus) add.
var knownFields = []string{"cniVersion", "cniVersions", "name", "type", "capabilities", "ipam", "dns", "prevResult",
	"runtimeConfig", "args", "resourceName", "flows", "deviceID", "mtu", "daemonSocket", "disableCheck", "disableGC",
	"cni.dev/valid-attachments"}

// freeForm are the sections other parties own: the IPAM plugin's
// configuration, DNS, the previous result, capabilities, args.
var freeForm = []string{"ipam", "dns", "prevResult", "capabilities", "args"}

// ParseNetConf decodes and checks the configuration on a CNI plugin's
// stdin. Every error is a CNI error with a code ≥ 100 naming the field.
func ParseNetConf(b []byte) (*NetConf, []ParsedFlow, error) {
	var raw map[string]json.RawMessage
	if err := json.Unmarshal(b, &raw); err != nil {
		return nil, nil, fieldError("(config)", "not a JSON object: %v", err)
	}
	var keys []string
	for k := range raw {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		if !slices.Contains(knownFields, k) {
			return nil, nil, fieldError(k, "unknown field; allowed: %s", strings.Join(knownFields, ", "))
		}
	}
	// The plugin's own fields are decoded strictly; the sections owned by
	// others (the IPAM plugin's, the runtime's) are left as they are.
	strict := map[string]json.RawMessage{}
	for k, v := range raw {
		if !slices.Contains(freeForm, k) {
			strict[k] = v
		}
	}
	sb, _ := json.Marshal(strict)
	dec := json.NewDecoder(bytes.NewReader(sb))
	dec.DisallowUnknownFields()
	var c NetConf
	if err := dec.Decode(&c); err != nil {
		// Unknown nested fields and wrong types: json names the field.
		return nil, nil, fieldError("(config)", "%v", err)
	}
	if err := json.Unmarshal(b, &c.NetConf); err != nil {
		return nil, nil, fieldError("(config)", "%v", err)
	}
	if c.CNIVersion == "" {
		return nil, nil, fieldError("cniVersion", "required; this plugin speaks %s", strings.Join(SupportedVersions.SupportedVersions(), ", "))
	}
	if !slices.Contains(SupportedVersions.SupportedVersions(), c.CNIVersion) {
		return nil, nil, fieldError("cniVersion", "%q; this plugin speaks %s", c.CNIVersion, strings.Join(SupportedVersions.SupportedVersions(), ", "))
	}
	if c.Name == "" {
		return nil, nil, fieldError("name", "required")
	}
	if c.ResourceName != "" && !strings.Contains(c.ResourceName, "/") {
		return nil, nil, fieldError("resourceName", "%q: want <prefix>/<pool>, e.g. xdpq.io/upf", c.ResourceName)
	}
	if c.MTU != 0 && (c.MTU < 68 || c.MTU > 65535) {
		return nil, nil, fieldError("mtu", "%d: from 68 to 65535", c.MTU)
	}
	if c.RuntimeConfig.DeviceID != "" {
		if c.DeviceID != "" && c.DeviceID != c.RuntimeConfig.DeviceID {
			return nil, nil, fieldError("deviceID", "%q differs from runtimeConfig.deviceID %q", c.DeviceID, c.RuntimeConfig.DeviceID)
		}
		c.DeviceID = c.RuntimeConfig.DeviceID
	}
	var flows []ParsedFlow
	for i, f := range c.Flows {
		pf, err := parseFlow(f, fmt.Sprintf("flows[%d]", i))
		if err != nil {
			return nil, nil, err
		}
		flows = append(flows, pf)
	}
	return &c, flows, nil
}

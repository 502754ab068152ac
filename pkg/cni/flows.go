package cni

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/netip"

	"github.com/xdpq/xdpq/pkg/api"
)

// MaxFlows is how many flows one list (a NetConf's, a pod annotation's)
// may have.
const MaxFlows = 64

// ParseFlows decodes a JSON list of flows, the schema of NetConf's
// "flows" (a pod's xdpq.io/flows annotation has it too), and checks each;
// unknown fields are refused. An error names the list's field.
func ParseFlows(b []byte, field string) ([]ParsedFlow, error) {
	var fs []Flow
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&fs); err != nil {
		return nil, fmt.Errorf("%s: %w", field, err)
	}
	if dec.More() {
		return nil, fmt.Errorf("%s: more than one JSON value", field)
	}
	if len(fs) > MaxFlows {
		return nil, fmt.Errorf("%s: %d flows, at most %d", field, len(fs), MaxFlows)
	}
	out := make([]ParsedFlow, 0, len(fs))
	for i, f := range fs {
		pf, err := parseFlow(f, fmt.Sprintf("%s[%d]", field, i))
		if err != nil {
			return nil, err
		}
		out = append(out, pf)
	}
	return out, nil
}

// ResolveFlows gives the flows whose destination is the pod's address
// ("ipam" or empty) each of ips (of the source's family) and expands port
// ranges: the flows the daemon steers.
func ResolveFlows(flows []ParsedFlow, ips []netip.Addr) ([]api.CNIFlow, error) {
	return resolveFlows(flows, ips)
}

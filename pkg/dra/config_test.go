package dra

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/runtime"

	"github.com/xdpq/xdpq/pkg/flow"
)

// opaque is an allocation's config of source for requests (all when
// none) with the parameters raw, for driver.
func opaque(source resourceapi.AllocationConfigSource, driver, raw string, requests ...string) resourceapi.DeviceAllocationConfiguration {
	return resourceapi.DeviceAllocationConfiguration{Source: source, Requests: requests,
		DeviceConfiguration: resourceapi.DeviceConfiguration{Opaque: &resourceapi.OpaqueDeviceConfiguration{
			Driver: driver, Parameters: runtime.RawExtension{Raw: []byte(raw)}}}}
}

func classConfig(raw string, requests ...string) resourceapi.DeviceAllocationConfiguration {
	return opaque(resourceapi.AllocationConfigSourceClass, DriverName, raw, requests...)
}

func claimConfig(raw string, requests ...string) resourceapi.DeviceAllocationConfiguration {
	return opaque(resourceapi.AllocationConfigSourceClaim, DriverName, raw, requests...)
}

// params are a QueueConfig's parameters with these flows ("" for none).
func params(flows string) string {
	if flows == "" {
		return `{"apiVersion":"xdpq.io/v1alpha1","kind":"QueueConfig"}`
	}
	return `{"apiVersion":"xdpq.io/v1alpha1","kind":"QueueConfig","flows":` + flows + `}`
}

// iface are a QueueConfig's parameters with this interface.
func iface(i string) string {
	return `{"apiVersion":"xdpq.io/v1alpha1","kind":"QueueConfig","interface":` + i + `}`
}

func allocatedClaim(configs ...resourceapi.DeviceAllocationConfiguration) *resourceapi.ResourceClaim {
	c := &resourceapi.ResourceClaim{}
	c.Status.Allocation = &resourceapi.AllocationResult{Devices: resourceapi.DeviceAllocationResult{Config: configs}}
	return c
}

const (
	gtpFlows = `[{"protocol":"udp","destinationPort":"2152"}]`
	dnsFlows = `[{"protocol":"udp","destinationPort":"53"},{"protocol":"tcp","destinationPort":"53"}]`
)

func TestClaimConfig(t *testing.T) {
	for _, c := range []struct {
		name     string
		configs  []resourceapi.DeviceAllocationConfiguration
		requests []string
		flows    string // "" for none
	}{
		{name: "none", requests: []string{"queues"}},
		{name: "class", configs: []resourceapi.DeviceAllocationConfiguration{classConfig(params(gtpFlows))},
			requests: []string{"queues"}, flows: gtpFlows},
		{name: "claim's flows replace the class's", requests: []string{"queues"}, flows: dnsFlows,
			configs: []resourceapi.DeviceAllocationConfiguration{classConfig(params(gtpFlows)), claimConfig(params(dnsFlows))}},
		{name: "claim's empty flows replace the class's", requests: []string{"queues"}, flows: `[]`,
			configs: []resourceapi.DeviceAllocationConfiguration{classConfig(params(gtpFlows)), claimConfig(params(`[]`))}},
		{name: "claim without flows keeps the class's", requests: []string{"queues"}, flows: gtpFlows,
			configs: []resourceapi.DeviceAllocationConfiguration{classConfig(params(gtpFlows)), claimConfig(params(""))}},
		{name: "null flows keep the class's", requests: []string{"queues"}, flows: gtpFlows,
			configs: []resourceapi.DeviceAllocationConfiguration{classConfig(params(gtpFlows)), claimConfig(params("null"))}},
		{name: "another driver's config", requests: []string{"queues"}, flows: gtpFlows,
			configs: []resourceapi.DeviceAllocationConfiguration{classConfig(params(gtpFlows)),
				opaque(resourceapi.AllocationConfigSourceClaim, "gpu.example.com", `{"not":"ours"}`)}},
		{name: "another request's config", requests: []string{"queues"}, flows: gtpFlows,
			configs: []resourceapi.DeviceAllocationConfiguration{classConfig(params(gtpFlows)),
				claimConfig(params(dnsFlows), "gpu"), claimConfig(`{"kind":"broken"}`, "gpu")}},
		{name: "the request's and another's", requests: []string{"queues"}, flows: dnsFlows,
			configs: []resourceapi.DeviceAllocationConfiguration{claimConfig(params(dnsFlows), "gpu", "queues")}},
		{name: "subrequest, config of its request", requests: []string{"req/sub"}, flows: dnsFlows,
			configs: []resourceapi.DeviceAllocationConfiguration{claimConfig(params(dnsFlows), "req")}},
		{name: "subrequest, config of it", requests: []string{"req/sub"}, flows: dnsFlows,
			configs: []resourceapi.DeviceAllocationConfiguration{claimConfig(params(dnsFlows), "req/sub")}},
		{name: "subrequest, config of another", requests: []string{"req/sub"},
			configs: []resourceapi.DeviceAllocationConfiguration{claimConfig(params(dnsFlows), "req/other")}},
		{name: "request whose name a config's starts", requests: []string{"req"},
			configs: []resourceapi.DeviceAllocationConfiguration{claimConfig(params(dnsFlows), "re"), claimConfig(params(dnsFlows), "req2")}},
		{name: "config of a subrequest, not of its request", requests: []string{"req"},
			configs: []resourceapi.DeviceAllocationConfiguration{claimConfig(params(dnsFlows), "req/sub")}},
		{name: "config without opaque", requests: []string{"queues"}, flows: gtpFlows,
			configs: []resourceapi.DeviceAllocationConfiguration{classConfig(params(gtpFlows)), {Source: resourceapi.AllocationConfigSourceClaim}}},
	} {
		t.Run(c.name, func(t *testing.T) {
			got, err := ClaimConfig(allocatedClaim(c.configs...), c.requests)
			if err != nil {
				t.Fatal(err)
			}
			if got.APIVersion != ConfigAPIVersion || got.Kind != ConfigKind {
				t.Errorf("%s %s", got.APIVersion, got.Kind)
			}
			if string(got.Flows) != c.flows {
				t.Errorf("flows %s, want %s", got.Flows, c.flows)
			}
		})
	}
	// The claim's interface replaces the class's whole; flows stay.
	got, err := ClaimConfig(allocatedClaim(classConfig(params(gtpFlows)), classConfig(iface(`{"name":"upf0","mtu":9000}`)),
		claimConfig(iface(`{"name":"net1","addresses":["192.0.2.7/24","2001:db8::7/64"]}`))), []string{"queues"})
	if err != nil || got.Interface == nil || got.Interface.Name != "net1" || got.Interface.MTU != 0 || string(got.Flows) != gtpFlows ||
		len(got.Interface.Prefixes()) != 2 || got.Interface.Prefixes()[1].String() != "2001:db8::7/64" {
		t.Errorf("interface of the claim over the class's: %+v %v", got, err)
	}
	if got, err := ClaimConfig(&resourceapi.ResourceClaim{}, []string{"queues"}); err != nil || got.Flows != nil {
		t.Errorf("a claim not allocated: %+v, %v", got, err)
	}
}

func TestClaimConfigRefused(t *testing.T) {
	for _, c := range []struct {
		name, raw, field string
	}{
		{name: "apiVersion", raw: `{"apiVersion":"xdpq.io/v1","kind":"QueueConfig"}`, field: "apiVersion"},
		{name: "apiVersion missing", raw: `{"kind":"QueueConfig"}`, field: "apiVersion"},
		{name: "apiVersion a number", raw: `{"apiVersion":1,"kind":"QueueConfig"}`, field: "apiVersion"},
		{name: "kind", raw: `{"apiVersion":"xdpq.io/v1alpha1","kind":"NetdevConfig"}`, field: "kind"},
		{name: "unknown field", raw: `{"apiVersion":"xdpq.io/v1alpha1","kind":"QueueConfig","flowz":[]}`, field: "flowz"},
		{name: "protocol", raw: params(`[{"protocol":"icmp"}]`), field: "flows[0].protocol"},
		{name: "port", raw: params(`[{"protocol":"udp"},{"protocol":"udp","destinationPort":"70000"}]`), field: "flows[1].destinationPort"},
		{name: "flows an object", raw: params(`{"protocol":"udp"}`), field: "flows"},
		{name: "flows a string", raw: params(`"udp/2152"`), field: "flows"},
		{name: "a flow's unknown field", raw: params(`[{"protocol":"udp","port":"53"}]`), field: "flows"},
		{name: "not JSON", raw: `apiVersion: xdpq.io/v1alpha1`, field: "parameters"},
		{name: "empty", raw: ``, field: "parameters"},
		{name: "two values", raw: params("") + params(""), field: "parameters"},
		{name: "a key in another case", raw: `{"apiVersion":"xdpq.io/v1alpha1","kind":"QueueConfig","Flows":[]}`, field: "Flows"},
		{name: "interface name too long", raw: iface(`{"name":"abcdefghijklmnop"}`), field: "interface.name"},
		{name: "interface name with a slash", raw: iface(`{"name":"a/b"}`), field: "interface.name"},
		{name: "interface name dot", raw: iface(`{"name":".."}`), field: "interface.name"},
		{name: "interface mtu", raw: iface(`{"mtu":40}`), field: "interface.mtu"},
		{name: "interface mtu a string", raw: iface(`{"mtu":"9000"}`), field: "interface.mtu"},
		{name: "interface address without prefix", raw: iface(`{"addresses":["192.0.2.7/24","192.0.2.8"]}`), field: "interface.addresses[1]"},
		{name: "interface unknown field", raw: iface(`{"ips":["192.0.2.7/24"]}`), field: "interface.ips"},
		{name: "interface key in another case", raw: iface(`{"Name":"net1"}`), field: "interface.Name"},
	} {
		t.Run(c.name, func(t *testing.T) {
			claim := allocatedClaim(classConfig(params(gtpFlows)), claimConfig(`{"not":"ours"}`, "gpu"), claimConfig(c.raw, "queues"))
			_, err := ClaimConfig(claim, []string{"queues"})
			var ce *ConfigError
			if !errors.As(err, &ce) {
				t.Fatalf("%v (%T), want a *ConfigError", err, err)
			}
			if ce.Field != c.field || ce.Source != "claim" || ce.Index != 2 {
				t.Errorf("field %q, source %q, index %d; want %q, claim, 2", ce.Field, ce.Source, ce.Index, c.field)
			}
			msg := err.Error()
			for _, s := range []string{"claim config 2", DriverName, c.field + ": "} {
				if !strings.Contains(msg, s) {
					t.Errorf("%q does not say %q", msg, s)
				}
			}
		})
	}
	// A class's config is named as such.
	_, err := ClaimConfig(allocatedClaim(classConfig(params(`[{"protocol":"sctp"}]`))), []string{"queues"})
	var ce *ConfigError
	if !errors.As(err, &ce) || ce.Source != "class" || ce.Index != 0 || ce.Field != "flows[0].protocol" {
		t.Errorf("%#v", err)
	}
}

func FuzzDecodeConfig(f *testing.F) {
	for _, s := range []string{params(gtpFlows), params(dnsFlows), params(""), params("null"), params(`[]`),
		params(`[{"protocol":"tcp","destination":"10.0.0.0/8","destinationPort":"80-81","source":"10.1.0.1","sourcePort":"5","vlan":7}]`),
		params(`[{"protocol":"icmp"}]`), params(`{}`), `{"flowz":1}`, `null`, ``, `[]`, params("") + "{}",
		`{"apiVersion":"xdpq.io/v1alpha1","kind":"QueueConfig","Flows":[{"protocol":"udp"}]}`,
		iface(`{"name":"net1","mtu":9000,"addresses":["192.0.2.7/24"]}`), iface(`{"Mtu":1}`), iface(`null`), iface(`[]`)} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, raw []byte) {
		c, field, err := decodeConfig(raw)
		if err != nil {
			if field == "" {
				t.Errorf("%q: %v names no field", raw, err)
			}
			return
		}
		if field != "" {
			t.Errorf("%q: no error, field %q", raw, field)
		}
		if c.APIVersion != ConfigAPIVersion || c.Kind != ConfigKind {
			t.Errorf("%q: accepted as %s %s", raw, c.APIVersion, c.Kind)
		}
		if c.Interface != nil {
			if field, err := c.Interface.check(); err != nil {
				t.Errorf("%q: accepted an interface that is wrong: %s: %v", raw, field, err)
			}
			if len(c.Interface.Prefixes()) != len(c.Interface.Addresses) {
				t.Errorf("%q: addresses %q, prefixes %v", raw, c.Interface.Addresses, c.Interface.Prefixes())
			}
		}
		if c.Flows == nil {
			return
		}
		if _, err := flow.ParseList(c.Flows, "flows"); err != nil {
			t.Errorf("%q: accepted flows %s that do not parse: %v", raw, c.Flows, err)
		}
		if !json.Valid(c.Flows) {
			t.Errorf("%q: flows %q", raw, c.Flows)
		}
	})
}

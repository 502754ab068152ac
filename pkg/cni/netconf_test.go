package cni

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"strings"
	"testing"

	"github.com/containernetworking/cni/pkg/types"
)

func TestParseNetConf(t *testing.T) {
	for _, ver := range []string{"0.4.0", "1.0.0", "1.1.0"} {
		good := fmt.Sprintf(`{"cniVersion":%q,"name":"upf","type":"xdpq","resourceName":"xdpq.io/upf",
			"ipam":{"type":"host-local","subnet":"10.10.0.0/24"},
			"flows":[{"protocol":"udp","destinationPort":"2152"},{"protocol":"tcp","destination":"10.20.0.0/16","destinationPort":"8000-8003","source":"10.9.9.9","vlan":100}],
			"runtimeConfig":{"deviceID":"eth1-q8"}}`, ver)
		c, flows, err := ParseNetConf([]byte(good))
		if err != nil {
			t.Fatalf("%s: %v", ver, err)
		}
		if c.DeviceID != "eth1-q8" || c.IPAM.Type != "host-local" || len(flows) != 2 ||
			flows[0].Dst.IsValid() || len(flows[0].DstPorts) != 1 || len(flows[1].DstPorts) != 4 || flows[1].VLAN != 100 {
			t.Errorf("%s: %+v %+v", ver, c, flows)
		}
	}
	for _, c := range []struct {
		conf, field, detail string
	}{
		{`{"cniVersion":"1.0.0","name":"n","type":"xdpq","flow":[]}`, "flow", "unknown field"},
		{`{"cniVersion":"1.0.0","name":"n","type":"xdpq","flows":[{"protocol":"udp","port":1}]}`, "(config)", `unknown field "port"`},
		{`{"cniVersion":"0.3.1","name":"n","type":"xdpq"}`, "cniVersion", "speaks 0.4.0, 1.0.0, 1.1.0"},
		{`{"name":"n","type":"xdpq"}`, "cniVersion", "required"},
		{`{"cniVersion":"1.0.0","type":"xdpq"}`, "name", "required"},
		{`{"cniVersion":"1.0.0","name":"n","type":"xdpq","resourceName":"upf"}`, "resourceName", "<prefix>/<pool>"},
		{`{"cniVersion":"1.0.0","name":"n","type":"xdpq","mtu":20}`, "mtu", "68"},
		{`{"cniVersion":"1.0.0","name":"n","type":"xdpq","flows":[{"protocol":"sctp"}]}`, "flows[0].protocol", "udp or tcp"},
		{`{"cniVersion":"1.0.0","name":"n","type":"xdpq","flows":[{"protocol":"udp","destination":"10.0.0.300"}]}`, "flows[0].destination", "not an address"},
		{`{"cniVersion":"1.0.0","name":"n","type":"xdpq","flows":[{"protocol":"udp","destinationPort":"1-1000"}]}`, "flows[0].destinationPort", "at most 64"},
		{`{"cniVersion":"1.0.0","name":"n","type":"xdpq","flows":[{"protocol":"udp","destinationPort":"9-3"}]}`, "flows[0].destinationPort", "lower to a higher"},
		{`{"cniVersion":"1.0.0","name":"n","type":"xdpq","flows":[{"protocol":"udp","vlan":5000}]}`, "flows[0].vlan", "4094"},
		{`{"cniVersion":"1.0.0","name":"n","type":"xdpq","flows":[{"protocol":"udp","destination":"fd00::1","source":"10.0.0.1"}]}`, "flows[0].source", "IP version"},
		{`{"cniVersion":"1.0.0","name":"n","type":"xdpq","deviceID":"a","runtimeConfig":{"deviceID":"b"}}`, "deviceID", "differs"},
		{`{"cniVersion":"1.0.0","name":"n","type":"xdpq","mtu":"big"}`, "(config)", "mtu"},
		{`[1,2]`, "(config)", "not a JSON object"},
	} {
		_, _, err := ParseNetConf([]byte(c.conf))
		var ce *types.Error
		if !errors.As(err, &ce) || ce.Code < 100 || !strings.Contains(ce.Msg, c.field) || !strings.Contains(ce.Details, c.detail) {
			t.Errorf("%s: got %v, want code ≥ 100 naming %q with %q", c.conf, err, c.field, c.detail)
		}
		if ce != nil {
			if b, _ := json.Marshal(ce); !strings.Contains(string(b), `"code":100`) {
				t.Errorf("the CNI error JSON lacks the code: %s", b)
			}
		}
	}
}

func FuzzParseNetConf(f *testing.F) {
	f.Add([]byte(`{"cniVersion":"1.1.0","name":"upf","type":"xdpq","resourceName":"xdpq.io/upf","ipam":{"type":"host-local"},"flows":[{"protocol":"udp","destinationPort":"2152"}]}`))
	f.Add([]byte(`{"cniVersion":"0.4.0","name":"n","type":"xdpq","flows":[{"protocol":"tcp","destination":"fd00::/64","destinationPort":"1-64","source":"fd00::9","sourcePort":"7","vlan":4094}]}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		c, flows, err := ParseNetConf(b)
		if err != nil {
			var ce *types.Error
			if !errors.As(err, &ce) || ce.Code != ErrInvalidField {
				t.Fatalf("error %v is not a CNI error with code %d", err, ErrInvalidField)
			}
			return
		}
		if c.Name == "" || len(flows) != len(c.Flows) {
			t.Fatalf("accepted %+v", c)
		}
		for _, f := range flows {
			if len(f.DstPorts) > MaxPortRange || f.VLAN > 4094 {
				t.Fatalf("flow %+v", f)
			}
		}
	})
}

// TestDocsExample: the README's configuration parses.
func TestDocsExample(t *testing.T) {
	b, err := os.ReadFile("../../docs/cni-example.conf")
	if err != nil {
		t.Fatal(err)
	}
	c, flows, err := ParseNetConf(b)
	if err != nil {
		t.Fatal(err)
	}
	if c.ResourceName != "xdpq.io/upf" || len(flows) != 2 || flows[0].Dst.IsValid() || len(flows[1].DstPorts) != 16 {
		t.Errorf("%+v %+v", c, flows)
	}
}

package flow

import (
	"net/netip"
	"strconv"
	"strings"
	"testing"
)

func TestParseList(t *testing.T) {
	ips := []netip.Addr{netip.MustParseAddr("10.244.0.7")}
	for _, c := range []struct {
		in, want, err string
	}{
		{in: `[{"protocol":"udp","destinationPort":"2152"}]`, want: "udp 10.244.0.7/32:2152"},
		{in: `[{"protocol":"tcp","destination":"ipam","destinationPort":"80-81"}]`, want: "tcp 10.244.0.7/32:80 tcp 10.244.0.7/32:81"},
		{in: `[{"protocol":"udp","destination":"10.9.0.0/16"}]`, want: "udp 10.9.0.0/16:0"},
		{in: `[]`, want: ""},
		{in: `[{"protocol":"icmp"}]`, err: "flows[0].protocol"},
		{in: `[{"protocol":"udp","port":5}]`, err: `unknown field "port"`},
		{in: `{"protocol":"udp"}`, err: "cannot unmarshal object"},
		{in: `[] []`, err: "more than one JSON value"},
		{in: `[{"protocol":"udp","destinationPort":"1-100"}]`, err: "flows[0].destinationPort"},
	} {
		fs, err := ParseList([]byte(c.in), "flows")
		if c.err != "" {
			if err == nil || !strings.Contains(err.Error(), c.err) {
				t.Errorf("%s: %v, want %q", c.in, err, c.err)
			}
			continue
		}
		if err != nil {
			t.Errorf("%s: %v", c.in, err)
			continue
		}
		got, err := Resolve(fs, ips)
		if err != nil {
			t.Errorf("%s: %v", c.in, err)
			continue
		}
		var s []string
		for _, f := range got {
			s = append(s, f.Protocol+" "+f.Dst.String()+":"+itoa(f.DstPort))
		}
		if strings.Join(s, " ") != c.want {
			t.Errorf("%s: %q, want %q", c.in, strings.Join(s, " "), c.want)
		}
	}
}

func itoa(p uint16) string { return strconv.Itoa(int(p)) }

func FuzzParseList(f *testing.F) {
	f.Add([]byte(`[{"protocol":"udp","destination":"10.0.0.1","destinationPort":"2000-2063","source":"10.1.0.0/16","sourcePort":"5","vlan":7}]`))
	f.Add([]byte(`[]`))
	f.Fuzz(func(t *testing.T, b []byte) {
		fs, err := ParseList(b, "flows")
		if err != nil {
			return
		}
		if len(fs) > MaxFlows {
			t.Fatalf("%d flows", len(fs))
		}
		for _, f := range fs {
			if f.Protocol != "udp" && f.Protocol != "tcp" || len(f.DstPorts) > MaxPortRange {
				t.Fatalf("accepted %+v", f)
			}
		}
	})
}

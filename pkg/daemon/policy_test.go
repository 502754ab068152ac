package daemon

import (
	"reflect"
	"slices"
	"testing"
	"time"

	"github.com/xdpq/xdpq/pkg/agent"
	"github.com/xdpq/xdpq/pkg/config"
	"github.com/xdpq/xdpq/pkg/xdp"
)

// TestPolicyEqualComparesEveryField: two policies that differ in any one
// field are not equal, so that a reconcile puts a changed field in force.
// A field added to agent.Policy and not compared by policyEqual fails
// here (by reflection, a value of each field's kind).
func TestPolicyEqualComparesEveryField(t *testing.T) {
	base := agent.Policy{Steering: agent.SteerHardware, Reserved: []uint32{4, 5}, Linger: time.Second}
	if !policyEqual(base, base) {
		t.Fatal("a policy is not equal to itself")
	}
	typ := reflect.TypeFor[agent.Policy]()
	for i := range typ.NumField() {
		f := typ.Field(i)
		other := base
		v := reflect.ValueOf(&other).Elem().Field(i)
		switch {
		case f.Type == reflect.TypeFor[[]uint32]():
			v.Set(reflect.ValueOf([]uint32{4, 6}))
		case f.Type == reflect.TypeFor[agent.RuleRange]():
			v.Set(reflect.ValueOf(agent.RuleRange{First: 100, Count: 8}))
		case f.Type == reflect.TypeFor[xdp.Mode]():
			v.Set(reflect.ValueOf(xdp.ModeGeneric))
		case f.Type.Kind() == reflect.Bool:
			v.SetBool(!v.Bool())
		case f.Type.Kind() == reflect.String:
			v.SetString(v.String() + "-other")
		case f.Type.Kind() == reflect.Int64:
			v.SetInt(v.Int() + 1)
		default:
			t.Fatalf("agent.Policy.%s is of a type (%v) this test cannot vary: teach it", f.Name, f.Type)
		}
		if policyEqual(base, other) {
			t.Errorf("policyEqual does not compare agent.Policy.%s", f.Name)
		}
	}
	// Reserved queues nil and empty are the same policy.
	if !policyEqual(agent.Policy{}, agent.Policy{Reserved: []uint32{}}) {
		t.Error("nil and no reserved queues differ")
	}
}

// TestPolicyFor: what a pool's settings make of a netdev's policy, on the
// node and in a pod.
func TestPolicyFor(t *testing.T) {
	busy := &config.BusyPoll{TimeoutMicros: 50, Budget: 64}
	for _, c := range []struct {
		name     string
		pool     config.Pool
		reserved []uint32
		node     agent.Policy
		// pod: in a pod with flows, without flows, and with its map out.
		podFlows, podNone, podMapOut agent.Policy
	}{
		{
			name: "hardware, on demand", pool: config.Pool{Steering: "hardware", Attach: "onDemand", Linger: config.Duration{Duration: time.Second}},
			reserved:  []uint32{2, 3},
			node:      agent.Policy{Steering: agent.SteerHardware, Reserved: []uint32{2, 3}, Linger: time.Second},
			podFlows:  agent.Policy{Steering: agent.SteerHardware, Linger: time.Second},
			podNone:   agent.Policy{Steering: agent.SteerHardware, Linger: time.Second},
			podMapOut: agent.Policy{Steering: agent.SteerHardware, Linger: time.Second, AttachAlways: true},
		},
		{
			name: "software keeps no queue off RSS", pool: config.Pool{Steering: "software", Attach: "always", Exclusive: true, BusyPoll: busy},
			reserved:  []uint32{2, 3},
			node:      agent.Policy{Steering: agent.SteerSoftware, AttachAlways: true, Exclusive: true, BusyPoll: true},
			podFlows:  agent.Policy{Steering: agent.SteerSoftware, AttachAlways: true, Exclusive: true, BusyPoll: true},
			podNone:   agent.Policy{Steering: agent.SteerHardware, AttachAlways: true, Exclusive: true, BusyPoll: true},
			podMapOut: agent.Policy{Steering: agent.SteerHardware, AttachAlways: true, Exclusive: true, BusyPoll: true},
		},
	} {
		check := func(what string, got, want agent.Policy) {
			if !policyEqual(got, want) {
				t.Errorf("%s, %s: %+v, want %+v", c.name, what, got, want)
			}
		}
		reserved := slices.Clone(c.reserved)
		pol := policyFor(c.pool, reserved)
		check("on the node", pol, c.node)
		reserved[0] = 99 // the caller's slice, changed after
		check("on the node, its reserved queues its own", pol, c.node)
		check("in a pod with flows", podPolicy(c.pool, true, false), c.podFlows)
		check("in a pod without flows", podPolicy(c.pool, false, false), c.podNone)
		check("in a pod, its map handed out", podPolicy(c.pool, false, true), c.podMapOut)
	}
}

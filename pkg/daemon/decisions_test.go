package daemon

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"

	"github.com/xdpq/xdpq/pkg/api"
	"github.com/xdpq/xdpq/pkg/nic"
)

// pools is a config of queue-mode pools, each "name:netdev#queues[:steering]".
func pools(specs ...string) string {
	var b strings.Builder
	b.WriteString("pools: [")
	for i, s := range specs {
		f := strings.Split(s, ":")
		steering := "hardware"
		if len(f) > 2 {
			steering = f[2]
		}
		if i > 0 {
			b.WriteString(", ")
		}
		b.WriteString("{name: " + f[0] + ", steering: " + steering + ", devices: {netdevs: ['" + f[1] + "']}}")
	}
	b.WriteString("]\n")
	return b.String()
}

// TestReloadDecisions: what a reload changes, and what it keeps, against
// a fake node agent: the calls the reconciler makes (nothing else calls
// Set or Unmanage), the pools' capacity, and the problems status reports.
// Allocations are made before the reload, through the local API.
func TestReloadDecisions(t *testing.T) {
	errNIC := errors.New("the NIC refused")
	for _, c := range []struct {
		name          string
		before, after string
		allocs        map[string]int // pool: queues allocated before the reload
		gone          string         // a netdev gone from the node at the reload
		failSet       string         // a netdev whose Set fails at the reload
		failUnmanage  string
		wantCalls     []string // the agent's calls at the reload
		wantCapacity  []string
		wantProblem   string // in status' config error
		wantAgain     []string
	}{
		{
			name:         "unchanged: nothing asked of the kernel",
			before:       pools("upf:xa#0,1"),
			after:        pools("upf:xa#0,1"),
			wantCapacity: []string{"upf=2"},
		},
		{
			name:         "a pool grows: its queues kept off RSS",
			before:       pools("upf:xa#0,1"),
			after:        pools("upf:xa#0-2"),
			wantCalls:    []string{"set xa steering=hardware reserved=[0 1 2]"},
			wantCapacity: []string{"upf=3"},
		},
		{
			name:         "a pool shrinks: a free queue goes back to RSS",
			before:       pools("upf:xa#0-2"),
			after:        pools("upf:xa#0"),
			wantCalls:    []string{"set xa steering=hardware reserved=[0]"},
			wantCapacity: []string{"upf=1"},
		},
		{
			name:         "a pool shrinks under an allocation: its queues stay off RSS",
			before:       pools("upf:xa#0,1"),
			allocs:       map[string]int{"upf": 2},
			after:        pools("upf:xa#0"),
			wantCapacity: []string{"upf=1"}, // the policy is the same: no call
		},
		{
			name:         "a pool removed: its netdev let go",
			before:       pools("upf:xa#0,1", "dns:xb#0"),
			after:        pools("dns:xb#0"),
			wantCalls:    []string{"unmanage xa"},
			wantCapacity: []string{"dns=1"},
		},
		{
			name:         "a pool removed under an allocation: the netdev keeps its policy and the pool lingers",
			before:       pools("upf:xa#0,1", "dns:xb#0"),
			allocs:       map[string]int{"upf": 1},
			after:        pools("dns:xb#0"),
			wantCapacity: []string{"dns=1", "upf=0"},
		},
		{
			name:         "a netdev gone: let go when nothing holds it",
			before:       pools("upf:xa#0,1", "dns:xb#0"),
			gone:         "xa",
			after:        pools("upf:xa#0,1", "dns:xb#0"),
			wantCalls:    []string{"unmanage xa"},
			wantCapacity: []string{"dns=1", "upf=0"},
			wantProblem:  "pool upf: netdev xa is not on this node",
		},
		{
			name:         "a netdev gone under an allocation: kept as it was",
			before:       pools("upf:xa#0,1"),
			allocs:       map[string]int{"upf": 1},
			gone:         "xa",
			after:        pools("upf:xa#0,1"),
			wantCapacity: []string{"upf=0"},
			wantProblem:  "pool upf: netdev xa is not on this node",
		},
		{
			name:         "software steering keeps RSS on every queue",
			before:       pools("upf:xa#0,1"),
			after:        pools("upf:xa#0,1:software"),
			wantCalls:    []string{"set xa steering=software reserved=[]"},
			wantCapacity: []string{"upf=2"},
		},
		{
			name:         "two pools on a netdev disagree: the first one's settings, and a problem",
			before:       pools("upf:xa#0,1"),
			after:        pools("upf:xa#0,1", "dns:xa#2:software"),
			wantCalls:    []string{"set xa steering=hardware reserved=[0 1 2]"},
			wantCapacity: []string{"dns=1", "upf=2"},
			wantProblem:  "pools upf and dns share netdev xa and disagree on steering; upf's applies",
		},
		{
			name:         "a new netdev the agent refuses: not managed, asked again at the next reconcile",
			before:       pools("upf:xa#0"),
			after:        pools("upf:xa#0", "dns:xb#0"),
			failSet:      "xb",
			wantCalls:    []string{"set xb steering=hardware reserved=[0]"},
			wantCapacity: []string{"dns=1", "upf=1"},
			wantProblem:  "the NIC refused",
			wantAgain:    []string{"set xb steering=hardware reserved=[0]"},
		},
		{
			name:         "a managed netdev's new policy refused: kept managed, asked again only when the config changes",
			before:       pools("upf:xa#0"),
			after:        pools("upf:xa#0,1"),
			failSet:      "xa",
			wantCalls:    []string{"set xa steering=hardware reserved=[0 1]"},
			wantCapacity: []string{"upf=2"},
			wantProblem:  "the NIC refused",
		},
		{
			name:         "a netdev let go that the agent cannot release: said, and no longer managed",
			before:       pools("upf:xa#0", "dns:xb#0"),
			after:        pools("dns:xb#0"),
			failUnmanage: "xa",
			wantCalls:    []string{"unmanage xa"},
			wantCapacity: []string{"dns=1"},
			wantProblem:  "the NIC refused",
		},
	} {
		t.Run(c.name, func(t *testing.T) {
			n := newFakeNode(t, fakeNetdev("xa", 4), fakeNetdev("xb", 4))
			d, _ := n.daemon(c.before)
			ctx := context.Background()
			if err := d.start(ctx); err != nil {
				t.Fatal(err)
			}
			for pool, count := range c.allocs {
				if _, err := d.Alloc(ctx, api.AllocRequest{Pool: pool, Count: count, UID: 1000}); err != nil {
					t.Fatal(err)
				}
			}
			if c.gone != "" {
				n.netdevs = slices.DeleteFunc(n.netdevs, func(nd nic.Netdev) bool { return nd.Name == c.gone })
			}
			n.agent.setFail("set", c.failSet, errNIC)
			n.agent.setFail("unmanage", c.failUnmanage, errNIC)
			n.agent.take()
			n.reload(d, c.after)
			if got := n.agent.take(); !slices.Equal(got, c.wantCalls) {
				t.Errorf("the reload asked the agent\n  %q\nwant\n  %q", got, c.wantCalls)
			}
			if got := capacity(d); !slices.Equal(got, c.wantCapacity) {
				t.Errorf("pools after the reload %v, want %v", got, c.wantCapacity)
			}
			s, err := d.Status(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if c.wantProblem == "" && s.ConfigError != "" || !strings.Contains(s.ConfigError, c.wantProblem) {
				t.Errorf("status says %q, want %q", s.ConfigError, c.wantProblem)
			}
			// A resync with the same config asks again only what failed
			// for a netdev not yet managed.
			if err := d.request(ctx, reconcileRequest{discover: true}); err != nil {
				t.Fatal(err)
			}
			if got := n.agent.take(); !slices.Equal(got, c.wantAgain) {
				t.Errorf("the resync after it asked the agent\n  %q\nwant\n  %q", got, c.wantAgain)
			}
			// What the allocations hold is served throughout.
			if got, want := len(n.broker.servedIDs()), len(d.ledger.Allocations()); got != want {
				t.Errorf("%d allocations served, %d recorded", got, want)
			}
		})
	}
}

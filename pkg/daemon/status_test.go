package daemon

import (
	"context"
	"errors"
	"net/netip"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/xdpq/xdpq/pkg/api"
)

// TestStatusCountsTheList: status counts what GET /v1/allocations lists,
// in all and per pool, through the API: with two pools, allocations with
// and without attachments, after a free, and with a pool emptied; a
// pool's list holds its allocations and their attachments alone, sorted
// as the whole list is; a pool the daemon does not have is a 404 that
// names the pools.
func TestStatusCountsTheList(t *testing.T) {
	n := newFakeNode(t, fakeNetdev("xa", 4))
	d, _ := n.daemon("pools: [{name: a, steering: software, devices: {netdevs: ['xa#0-1']}}, " +
		"{name: b, steering: software, devices: {netdevs: ['xa#2-3']}}]\n")
	if err := d.core.start(context.Background()); err != nil {
		t.Fatal(err)
	}
	r := &fieldRig{t: t, o: d.opts, d: d}
	c := api.NewClient(n.serveAPI(d))
	// check compares status with the lists, and both with want (per
	// pool: allocations, attachments).
	check := func(when string, want map[string][2]int) {
		t.Helper()
		s, err := c.Status()
		if err != nil {
			t.Fatalf("%s: status: %v", when, err)
		}
		all, err := c.Allocations("")
		if err != nil {
			t.Fatalf("%s: allocations: %v", when, err)
		}
		var total [2]int
		for _, w := range want {
			total[0] += w[0]
			total[1] += w[1]
		}
		if s.Allocations != total[0] || s.Attachments != total[1] || len(all.Allocations) != total[0] || len(all.Attachments) != total[1] {
			t.Errorf("%s: status counts %d allocations, %d attachments; the list has %d, %d; want %v",
				when, s.Allocations, s.Attachments, len(all.Allocations), len(all.Attachments), total)
		}
		if !slices.IsSortedFunc(all.Allocations, func(a, b api.Allocation) int { return strings.Compare(a.ID, b.ID) }) ||
			!slices.IsSortedFunc(all.Attachments, func(a, b api.AttachmentStatus) int {
				return strings.Compare(a.ContainerID+"/"+a.IfName, b.ContainerID+"/"+b.IfName)
			}) {
			t.Errorf("%s: the list is not sorted: %+v", when, all)
		}
		if len(s.Pools) != len(want) {
			t.Fatalf("%s: pools %+v, want %d", when, s.Pools, len(want))
		}
		for _, ps := range s.Pools {
			l, err := c.Allocations(ps.Name)
			if err != nil {
				t.Fatalf("%s: allocations of %s: %v", when, ps.Name, err)
			}
			if ps.Allocations != want[ps.Name][0] || len(l.Allocations) != want[ps.Name][0] || len(l.Attachments) != want[ps.Name][1] ||
				l.Allocations == nil || l.Attachments == nil {
				t.Errorf("%s: pool %s counts %d allocations; its list %+v; want %v", when, ps.Name, ps.Allocations, l, want[ps.Name])
			}
			var ids []string
			for _, a := range l.Allocations {
				ids = append(ids, a.ID)
				if a.Pool != ps.Name {
					t.Errorf("%s: the list of %s has %+v", when, ps.Name, a)
				}
			}
			for _, att := range l.Attachments {
				if !slices.Contains(ids, att.AllocationID) {
					t.Errorf("%s: the list of %s has an attachment of %s", when, ps.Name, att.AllocationID)
				}
			}
			// The pool's entries are the whole list's, in its order.
			fromAll := api.AllocationList{Allocations: []api.Allocation{}, Attachments: []api.AttachmentStatus{}}
			for _, a := range all.Allocations {
				if a.Pool == ps.Name {
					fromAll.Allocations = append(fromAll.Allocations, a)
				}
			}
			for _, att := range all.Attachments {
				if slices.Contains(ids, att.AllocationID) {
					fromAll.Attachments = append(fromAll.Attachments, att)
				}
			}
			if !reflect.DeepEqual(*l, fromAll) {
				t.Errorf("%s: the list of %s\n%+v\nis not the whole list's\n%+v", when, ps.Name, l, fromAll)
			}
		}
	}
	check("at start", map[string][2]int{"a": {0, 0}, "b": {0, 0}})

	a1, a2, b1 := r.alloc("a", 1), r.alloc("a", 1), r.alloc("b", 2)
	for i, att := range []struct {
		alloc, container, ifname string
	}{{a1.ID, "c2", "net1"}, {a1.ID, "c1", "net2"}, {b1.ID, "c0", "net1"}} {
		flow := api.CNIFlow{Protocol: "udp", Dst: netip.PrefixFrom(netip.AddrFrom4([4]byte{10, 0, 0, byte(i + 1)}), 32), DstPort: 2152}
		if _, err := c.CNIAdd(api.CNIAddRequest{ContainerID: att.container, IfName: att.ifname, Allocation: att.alloc, Flows: []api.CNIFlow{flow}, Addresses: []netip.Addr{flow.Dst.Addr()}}); err != nil {
			t.Fatal(err)
		}
	}
	check("3 allocations, 3 attachments", map[string][2]int{"a": {2, 2}, "b": {1, 1}})

	if err := c.Free(a1.ID); err != nil {
		t.Fatal(err)
	}
	check("a1 freed", map[string][2]int{"a": {1, 0}, "b": {1, 1}})
	if err := c.Free(b1.ID); err != nil {
		t.Fatal(err)
	}
	check("b1 freed", map[string][2]int{"a": {1, 0}, "b": {0, 0}})
	if err := c.CNIDel("c0", "net1"); err != nil { // gone with b1: no error
		t.Fatal(err)
	}
	if err := c.Free(a2.ID); err != nil {
		t.Fatal(err)
	}
	check("all freed", map[string][2]int{"a": {0, 0}, "b": {0, 0}})

	_, err := c.Allocations("nope")
	if !errors.Is(err, api.ErrNotFound) || err.Error() != `no pool "nope" (pools: a, b)` {
		t.Errorf("allocations of an unknown pool: %v", err)
	}
}

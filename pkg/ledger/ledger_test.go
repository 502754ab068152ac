package ledger

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/xdpq/xdpq/pkg/api"
	"github.com/xdpq/xdpq/pkg/config"
)

type fakeClock struct{ t time.Time }

func (c *fakeClock) Now() time.Time { return c.t }

var t0 = time.Date(2026, 12, 3, 12, 0, 0, 0, time.UTC)

// queuePool is a pool of queues qs of each netdev.
func queuePool(name string, netdevs []string, qs ...uint32) Pool {
	p := Pool{Name: name, Resource: "xdpq.io/" + name, Config: config.Pool{Name: name, Mode: api.ModeQueue}}
	for _, n := range netdevs {
		for _, q := range qs {
			p.Devices = append(p.Devices, Device{ID: fmt.Sprintf("%s-q%d", n, q), Netdev: n, Queues: []uint32{q}, NUMA: -1})
		}
	}
	return p
}

func netdevPool(name string, netdevs ...string) Pool {
	p := Pool{Name: name, Resource: "xdpq.io/" + name, Config: config.Pool{Name: name, Mode: api.ModeNetdev}}
	for _, n := range netdevs {
		p.Devices = append(p.Devices, Device{ID: n, Netdev: n, Queues: []uint32{0, 1}, NUMA: -1})
	}
	return p
}

func open(t *testing.T, dir string) *Ledger {
	t.Helper()
	l, err := Open(Options{Dir: dir, Clock: &fakeClock{t0}})
	if err != nil {
		t.Fatal(err)
	}
	return l
}

// alloc reserves and commits.
func alloc(t *testing.T, l *Ledger, pool string, devs ...string) Allocation {
	t.Helper()
	a, err := l.Reserve(Reservation{Pool: pool, Devices: devs, Owner: Owner{PodUID: "p"}})
	if err != nil {
		t.Fatal(err)
	}
	if err := l.Commit(a.ID, nil); err != nil {
		t.Fatal(err)
	}
	a, _ = l.Get(a.ID)
	return a
}

func free(t *testing.T, l *Ledger, id string) {
	t.Helper()
	if _, err := l.BeginFree(id); err != nil {
		t.Fatal(err)
	}
	if err := l.EndFree(id); err != nil {
		t.Fatal(err)
	}
}

func files(t *testing.T, dir string) []string {
	t.Helper()
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, e := range ents {
		out = append(out, e.Name())
	}
	return out
}

func TestAllocationLifecycle(t *testing.T) {
	dir := t.TempDir()
	l := open(t, dir)
	ch := l.SetPools([]Pool{queuePool("upf", []string{"eth1", "eth2"}, 0, 1, 2, 3)})
	if fmt.Sprint(ch.Added) != "[upf]" {
		t.Errorf("added %v", ch.Added)
	}
	a, err := l.Reserve(Reservation{Pool: "upf", Devices: []string{"eth1-q2", "eth1-q1"}, Owner: Owner{PodUID: "pod-1"}})
	if err != nil {
		t.Fatal(err)
	}
	if a.State != Pending || a.Netdev != "eth1" || fmt.Sprint(a.Queues) != "[1 2]" || !a.Created.Equal(t0) || !strings.HasPrefix(a.ID, "upf-") {
		t.Errorf("reserved %+v", a)
	}
	if poolOfID(a.ID) != "upf" {
		t.Errorf("poolOfID(%s) = %q", a.ID, poolOfID(a.ID))
	}
	if len(files(t, dir)) != 0 || len(l.Allocations()) != 0 {
		t.Error("a pending allocation is persisted or reported")
	}
	if u := l.Usage("upf"); u.Devices != 8 || u.Free != 6 {
		t.Errorf("usage while pending %+v", u)
	}
	if err := l.Commit(a.ID, nil); err != nil {
		t.Fatal(err)
	}
	if got := files(t, dir); fmt.Sprint(got) != "["+a.ID+".json]" {
		t.Errorf("files %v", got)
	}
	if err := l.Commit(a.ID, nil); !errors.Is(err, ErrConflict) {
		t.Errorf("commit twice: %v", err)
	}

	// A second ledger on the same directory (the daemon restarted) has it.
	l2 := open(t, dir)
	l2.SetPools([]Pool{queuePool("upf", []string{"eth1", "eth2"}, 0, 1, 2, 3)})
	got, ok := l2.Get(a.ID)
	if !ok || got.State != Active || got.Owner.PodUID != "pod-1" || l2.Holder("upf", "eth1-q1") != a.ID {
		t.Fatalf("after reopening: %+v %v", got, ok)
	}
	if u := l2.Usage("upf"); u.Free != 6 {
		t.Errorf("usage after reopening %+v", u)
	}
	if _, err := l2.BeginFree(a.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := l2.BeginFree(a.ID); !errors.Is(err, ErrConflict) {
		t.Errorf("free while freeing: %v", err)
	}
	if r := open(t, dir).Recovery(); len(r.Freeing) != 1 || r.Freeing[0].ID != a.ID {
		t.Errorf("a crash while freeing: recovery %+v", r)
	}
	if err := l2.EndFree(a.ID); err != nil {
		t.Fatal(err)
	}
	if len(files(t, dir)) != 0 || l2.Usage("upf").Free != 8 {
		t.Errorf("after free: files %v, usage %+v", files(t, dir), l2.Usage("upf"))
	}
	if _, err := l2.BeginFree(a.ID); !errors.Is(err, ErrNotFound) {
		t.Errorf("free of a freed allocation: %v", err)
	}
}

func TestReserveRefused(t *testing.T) {
	l := open(t, t.TempDir())
	l.SetPools([]Pool{queuePool("upf", []string{"eth1", "eth2"}, 0, 1)})
	held := alloc(t, l, "upf", "eth1-q0")
	for _, c := range []struct {
		r    Reservation
		want error
		msg  string
	}{
		{Reservation{Pool: "nope", Devices: []string{"eth1-q1"}}, ErrNotFound, `no pool "nope" (pools: upf)`},
		{Reservation{Pool: "upf"}, ErrInvalid, "no devices"},
		{Reservation{Pool: "upf", Devices: []string{"eth9-q0"}}, ErrInvalid, "not in pool upf"},
		{Reservation{Pool: "upf", Devices: []string{"eth1-q1", "eth1-q1"}}, ErrInvalid, "twice"},
		{Reservation{Pool: "upf", Devices: []string{"eth1-q1", "eth2-q1"}}, ErrInvalid, "span netdevs eth1 and eth2"},
		{Reservation{Pool: "upf", Devices: []string{"eth1-q0"}}, ErrConflict, "in use by allocation " + held.ID},
	} {
		_, err := l.Reserve(c.r)
		if !errors.Is(err, c.want) || !strings.Contains(err.Error(), c.msg) {
			t.Errorf("%+v: %v, want %v with %q", c.r, err, c.want, c.msg)
		}
	}
	if u := l.Usage("upf"); u.Free != 3 {
		t.Errorf("refusals changed the usage: %+v", u)
	}
}

func TestPoolChanges(t *testing.T) {
	dir := t.TempDir()
	l := open(t, dir)
	l.SetPools([]Pool{queuePool("upf", []string{"eth1"}, 0, 1, 2, 3), queuePool("dns", []string{"eth2"}, 0)})
	a := alloc(t, l, "upf", "eth1-q2", "eth1-q3")
	b := alloc(t, l, "dns", "eth2-q0")

	// Shrink upf below the queues a holds; remove dns while b holds it.
	ch := l.SetPools([]Pool{queuePool("upf", []string{"eth1"}, 0, 1)})
	if fmt.Sprint(ch.Removed, ch.Lingering) != "[] [dns]" {
		t.Errorf("changes %+v", ch)
	}
	if u := l.Usage("upf"); u.Devices != 2 || u.Free != 2 || u.Beyond != 2 {
		t.Errorf("upf after the shrink %+v", u)
	}
	p, ok := l.Pool("dns")
	if u := l.Usage("dns"); !ok || len(p.Devices) != 0 || u.Free != 0 || u.Beyond != 1 || len(p.Problems) != 1 {
		t.Errorf("dns after its removal: %+v %+v", p, u)
	}
	if _, err := l.Reserve(Reservation{Pool: "dns", Devices: []string{"eth2-q0"}}); err == nil {
		t.Error("a removed pool gave out a device")
	}
	free(t, l, b.ID)
	if _, ok := l.Pool("dns"); ok {
		t.Error("a removed pool stays after its last allocation went")
	}
	// Another pool that names a's queues by other devices (a reload that
	// gives the netdev to a new pool) cannot give them out, even to a
	// replacing Allocate.
	l.SetPools([]Pool{queuePool("upf", []string{"eth1"}, 0, 1), queuePool("web", []string{"eth1"}, 0, 1, 2, 3)})
	if free, _ := l.FreeDevices("web"); len(free) != 2 {
		t.Errorf("web's free devices %v, want q0 and q1 (a holds q2 and q3)", free)
	}
	for _, replace := range []bool{false, true} {
		if _, err := l.Reserve(Reservation{Pool: "web", Devices: []string{"eth1-q3"}, Replace: replace}); !errors.Is(err, ErrConflict) {
			t.Errorf("web's q3 (replace %v): %v", replace, err)
		}
	}
	if l.Holder("upf", "eth1-q3") != a.ID || l.Holder("web", "eth1-q3") != a.ID {
		t.Error("the holder of q3 is not a's")
	}
	// Growing back: a still holds its queues.
	l.SetPools([]Pool{queuePool("upf", []string{"eth1"}, 0, 1, 2, 3)})
	if u := l.Usage("upf"); u.Free != 2 || u.Beyond != 0 || l.Holder("upf", "eth1-q3") != a.ID {
		t.Errorf("upf grown back %+v", u)
	}
}

func TestReplace(t *testing.T) {
	dir := t.TempDir()
	l := open(t, dir)
	l.SetPools([]Pool{queuePool("upf", []string{"eth1"}, 0, 1, 2)})
	old := alloc(t, l, "upf", "eth1-q0", "eth1-q1")
	flow := api.CNIFlow{Protocol: "udp", Dst: netip.MustParsePrefix("10.0.0.1/32"), DstPort: 2152}
	keep := attach(t, l, old.ID, "c1", "net1", flow)
	drop := attach(t, l, old.ID, "c1", "net2")

	if _, err := l.Reserve(Reservation{Pool: "upf", Devices: []string{"eth1-q0"}}); !errors.Is(err, ErrConflict) {
		t.Fatalf("a held device without Replace: %v", err)
	}
	n, err := l.Reserve(Reservation{Pool: "upf", Devices: []string{"eth1-q0", "eth1-q1"}, Replace: true})
	if err != nil {
		t.Fatal(err)
	}
	if fmt.Sprint(n.Replaces) != "["+old.ID+"]" {
		t.Errorf("replaces %v", n.Replaces)
	}
	if _, err := l.BeginFree(old.ID); !errors.Is(err, ErrConflict) || !strings.Contains(err.Error(), "being replaced") {
		t.Errorf("free of the allocation being replaced: %v", err)
	}
	// A crash now leaves the old allocation active on disk, whole.
	if o, _ := open(t, dir).Get(old.ID); o.State != Active || len(o.Attachments) != 2 {
		t.Errorf("the replaced allocation's record before Commit: %+v", o)
	}
	// Abort: the old one is back, whole.
	l.Abort(n.ID)
	if o, _ := l.Get(old.ID); o.State != Active || l.Holder("upf", "eth1-q0") != old.ID || len(o.Attachments) != 2 {
		t.Fatalf("after abort %+v", o)
	}
	n, err = l.Reserve(Reservation{Pool: "upf", Devices: []string{"eth1-q0", "eth1-q1"}, Replace: true})
	if err != nil {
		t.Fatal(err)
	}
	if err := l.Commit(n.ID, []Attachment{keep}); err != nil {
		t.Fatal(err)
	}
	if _, ok := l.Get(old.ID); ok {
		t.Error("the replaced allocation stays")
	}
	if got, ok := l.Attachment(keep.Key()); !ok || got.AllocationID != n.ID || got.State != Active {
		t.Errorf("the carried attachment %+v %v", got, ok)
	}
	if _, ok := l.Attachment(drop.Key()); ok {
		t.Error("an attachment not carried stays")
	}
	if got := files(t, dir); fmt.Sprint(got) != "["+n.ID+".json]" {
		t.Errorf("files %v", got)
	}
}

// TestReplaceCrash: a crash after the successor's record was written and
// before its predecessor's was removed leaves both; the successor wins.
func TestReplaceCrash(t *testing.T) {
	dir := t.TempDir()
	l := open(t, dir)
	l.SetPools([]Pool{queuePool("upf", []string{"eth1"}, 0, 1)})
	old := alloc(t, l, "upf", "eth1-q0")
	oldRec, _ := os.ReadFile(filepath.Join(dir, old.ID+".json"))
	n, err := l.Reserve(Reservation{Pool: "upf", Devices: []string{"eth1-q0"}, Replace: true})
	if err != nil {
		t.Fatal(err)
	}
	// What Commit writes first, and the predecessor's file still there.
	succ, _ := l.Get(n.ID)
	succ.State = Active
	if err := l.store.write(&succ); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, old.ID+".json"), oldRec, 0o600); err != nil {
		t.Fatal(err)
	}
	l2 := open(t, dir)
	if _, ok := l2.Get(old.ID); ok || l2.Holder("upf", "eth1-q0") != n.ID || len(l2.Broken()) != 0 {
		t.Errorf("after the crash: holder %s, broken %v", l2.Holder("upf", "eth1-q0"), l2.Broken())
	}
	if got := files(t, dir); fmt.Sprint(got) != "["+n.ID+".json]" {
		t.Errorf("files %v", got)
	}
}

func attach(t *testing.T, l *Ledger, alloc, container, ifname string, flows ...api.CNIFlow) Attachment {
	t.Helper()
	att := Attachment{Attachment: api.Attachment{CNIAddRequest: api.CNIAddRequest{ContainerID: container, IfName: ifname, Flows: flows},
		Mode: api.ModeQueue}}
	got, again, err := l.BeginAttach(alloc, att)
	if err != nil || again {
		t.Fatalf("begin attach: %v %v", err, again)
	}
	if err := l.EndAttach(got, true); err != nil {
		t.Fatal(err)
	}
	got, _ = l.Attachment(att.Key())
	return got
}

func TestAttachments(t *testing.T) {
	dir := t.TempDir()
	l := open(t, dir)
	l.SetPools([]Pool{queuePool("upf", []string{"eth1"}, 0, 1), netdevPool("vf", "vf0")})
	a := alloc(t, l, "upf", "eth1-q0", "eth1-q1")
	flow := api.CNIFlow{Protocol: "udp", Dst: netip.MustParsePrefix("10.0.0.1/32"), DstPort: 2152}
	req := Attachment{Attachment: api.Attachment{CNIAddRequest: api.CNIAddRequest{ContainerID: "c1", IfName: "net1", Flows: []api.CNIFlow{flow}},
		Mode: api.ModeQueue}}

	att, again, err := l.BeginAttach(a.ID, req)
	if err != nil || again || att.State != Pending || att.Netdev != "eth1" || fmt.Sprint(att.Queues) != "[0 1]" {
		t.Fatalf("begin attach: %+v %v %v", att, again, err)
	}
	// Written ahead: a crash now leaves a pending attachment to roll back.
	if r := open(t, dir).Recovery(); len(r.Attaching) != 1 || r.Attaching[0].Key() != "c1/net1" {
		t.Errorf("recovery while attaching %+v", r)
	}
	if _, _, err := l.BeginAttach(a.ID, req); !errors.Is(err, ErrConflict) || !strings.Contains(err.Error(), "in progress") {
		t.Errorf("a second ADD while the first runs: %v", err)
	}
	if _, err := l.BeginFree(a.ID); !errors.Is(err, ErrConflict) {
		t.Errorf("free while an ADD runs: %v", err)
	}
	att.Mac = "02:00:00:00:00:01"
	if err := l.EndAttach(att, true); err != nil {
		t.Fatal(err)
	}
	// A repeated ADD answers the attachment; another one on the key is refused.
	if got, again, err := l.BeginAttach(a.ID, req); err != nil || !again || got.Mac != att.Mac {
		t.Errorf("repeated ADD: %+v %v %v", got, again, err)
	}
	other := req
	other.Flows = nil
	if _, _, err := l.BeginAttach(a.ID, other); !errors.Is(err, ErrConflict) || !strings.Contains(err.Error(), "attached already") {
		t.Errorf("ADD with other flows: %v", err)
	}
	if _, _, err := l.BeginAttach("upf-000000000000", req); !errors.Is(err, ErrNotFound) {
		t.Errorf("ADD on a missing allocation: %v", err)
	}

	// A failed ADD leaves nothing.
	failed := req
	failed.IfName = "net2"
	f, _, err := l.BeginAttach(a.ID, failed)
	if err != nil {
		t.Fatal(err)
	}
	if err := l.EndAttach(f, false); err != nil {
		t.Fatal(err)
	}
	if _, ok := l.Attachment("c1/net2"); ok {
		t.Error("a failed ADD stays")
	}

	// DEL: written ahead too; idempotent.
	got, found, err := l.BeginDetach("c1/net1")
	if err != nil || !found || got.State != Ending {
		t.Fatalf("begin detach %+v %v %v", got, found, err)
	}
	if r := open(t, dir).Recovery(); len(r.Detaching) != 1 {
		t.Errorf("recovery while detaching %+v", r)
	}
	if _, _, err := l.BeginDetach("c1/net1"); !errors.Is(err, ErrConflict) {
		t.Errorf("a second DEL while the first runs: %v", err)
	}
	if err := l.EndDetach("c1/net1"); err != nil {
		t.Fatal(err)
	}
	if _, found, err := l.BeginDetach("c1/net1"); found || err != nil {
		t.Errorf("DEL of a gone attachment: %v %v", found, err)
	}

	// A netdev-mode allocation takes one netdev attachment.
	v := alloc(t, l, "vf", "vf0")
	nd := Attachment{Attachment: api.Attachment{CNIAddRequest: api.CNIAddRequest{ContainerID: "c2", IfName: "net1"}, Mode: api.ModeNetdev},
		Moved: []byte(`{"netdev":"vf0"}`)}
	nd1, _, err := l.BeginAttach(v.ID, nd)
	if err != nil {
		t.Fatal(err)
	}
	if err := l.EndAttach(nd1, true); err != nil {
		t.Fatal(err)
	}
	nd.ContainerID = "c3"
	if _, _, err := l.BeginAttach(v.ID, nd); !errors.Is(err, ErrConflict) || !strings.Contains(err.Error(), "netdev vf0 is in use by attachment c2/net1") {
		t.Errorf("a second netdev attachment: %v", err)
	}
	if got, _ := open(t, dir).Attachment("c2/net1"); string(got.Moved) != `{"netdev":"vf0"}` {
		t.Errorf("the mover's record after a restart: %q", got.Moved)
	}
}

// TestBrokenRecord: a record cut in half (or emptied, or garbage) removes
// nothing: it stays on disk, is reported, and blocks its pool, not others.
func TestBrokenRecord(t *testing.T) {
	for name, damage := range map[string]func([]byte) []byte{
		"cut in half": func(b []byte) []byte { return b[:len(b)/2] },
		"empty":       func([]byte) []byte { return nil },
		"garbage":     func([]byte) []byte { return []byte("\x00\x01 not json") },
		"other id":    func(b []byte) []byte { return []byte(strings.Replace(string(b), `"id":"upf-`, `"id":"xyz-`, 1)) },
	} {
		t.Run(name, func(t *testing.T) {
			dir := t.TempDir()
			pools := []Pool{queuePool("upf", []string{"eth1"}, 0, 1), queuePool("dns", []string{"eth2"}, 0)}
			l := open(t, dir)
			l.SetPools(pools)
			a := alloc(t, l, "upf", "eth1-q0")
			path := filepath.Join(dir, a.ID+".json")
			b, _ := os.ReadFile(path)
			damaged := damage(b)
			if err := os.WriteFile(path, damaged, 0o600); err != nil {
				t.Fatal(err)
			}

			l2 := open(t, dir)
			l2.SetPools(pools)
			if br := l2.Broken(); br[a.ID] == nil || !strings.Contains(br[a.ID].Error(), path) {
				t.Errorf("broken %v", br)
			}
			_, err := l2.Reserve(Reservation{Pool: "upf", Devices: []string{"eth1-q1"}})
			if !errors.Is(err, ErrUnavailable) || !strings.Contains(err.Error(), "repair the file or remove it") {
				t.Errorf("upf while its record is broken: %v", err)
			}
			// No device of it can be had: none is counted free.
			if u := l2.Usage("upf"); u.Blocked == "" || u.Free != 0 {
				t.Errorf("usage %+v: want upf blocked, nothing free", u)
			}
			if _, err := l2.Reserve(Reservation{Pool: "dns", Devices: []string{"eth2-q0"}}); err != nil {
				t.Errorf("another pool: %v", err)
			}
			if got, _ := os.ReadFile(path); string(got) != string(damaged) {
				t.Error("the broken record was changed")
			}
			// Repaired: it is back.
			if err := os.WriteFile(path, b, 0o600); err != nil {
				t.Fatal(err)
			}
			back := l2.Rescan()
			if len(back) != 1 || back[0].ID != a.ID || l2.Holder("upf", "eth1-q0") != a.ID || len(l2.Broken()) != 0 {
				t.Errorf("after repair: %+v, broken %v", back, l2.Broken())
			}
		})
	}
	t.Run("removed", func(t *testing.T) {
		dir := t.TempDir()
		l := open(t, dir)
		l.SetPools([]Pool{queuePool("upf", []string{"eth1"}, 0)})
		a := alloc(t, l, "upf", "eth1-q0")
		if err := os.WriteFile(filepath.Join(dir, a.ID+".json"), []byte("{"), 0o600); err != nil {
			t.Fatal(err)
		}
		l2 := open(t, dir)
		l2.SetPools([]Pool{queuePool("upf", []string{"eth1"}, 0)})
		os.Remove(filepath.Join(dir, a.ID+".json"))
		if back := l2.Rescan(); len(back) != 0 || len(l2.Broken()) != 0 {
			t.Fatalf("after removal: %v %v", back, l2.Broken())
		}
		alloc(t, l2, "upf", "eth1-q0")
	})
}

// TestConcurrent: many goroutines reserve, attach, detach and free at once;
// no device is ever held twice and the end state is empty.
func TestConcurrent(t *testing.T) {
	dir := t.TempDir()
	l := open(t, dir)
	l.SetPools([]Pool{queuePool("upf", []string{"eth1"}, 0, 1, 2, 3)})
	var wg sync.WaitGroup
	var mu sync.Mutex
	holding := map[string]string{}
	for g := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 200 {
				dev := fmt.Sprintf("eth1-q%d", (g+i)%4)
				a, err := l.Reserve(Reservation{Pool: "upf", Devices: []string{dev}})
				if err != nil {
					if !errors.Is(err, ErrConflict) {
						t.Error(err)
					}
					continue
				}
				mu.Lock()
				if h := holding[dev]; h != "" {
					t.Errorf("%s held by %s and %s", dev, h, a.ID)
				}
				holding[dev] = a.ID
				mu.Unlock()
				if err := l.Commit(a.ID, nil); err != nil {
					t.Error(err)
				}
				att, _, err := l.BeginAttach(a.ID, Attachment{Attachment: api.Attachment{
					CNIAddRequest: api.CNIAddRequest{ContainerID: a.ID, IfName: "net1"}, Mode: api.ModeQueue}})
				if err != nil {
					t.Error(err)
				}
				if err := l.EndAttach(att, true); err != nil {
					t.Error(err)
				}
				l.Usage("upf")
				l.Allocations()
				mu.Lock()
				delete(holding, dev)
				mu.Unlock()
				if _, err := l.BeginFree(a.ID); err != nil {
					t.Error(err)
				}
				if err := l.EndFree(a.ID); err != nil {
					t.Error(err)
				}
			}
		}()
	}
	wg.Wait()
	if u := l.Usage("upf"); u.Free != 4 || len(files(t, dir)) != 0 || len(l.Attachments()) != 0 {
		t.Errorf("at the end: %+v, files %v", u, files(t, dir))
	}
}

// TestUsageCache checks the cached Usage against a recount after every
// step of a random sequence of the operations that change what is held.
func TestUsageCache(t *testing.T) {
	l := open(t, t.TempDir())
	big := queuePool("upf", []string{"eth1"}, 0, 1, 2, 3)
	small := queuePool("upf", []string{"eth1"}, 0, 1)
	other := queuePool("dns", []string{"eth1"}, 2, 3)
	l.SetPools([]Pool{big})
	rng := rand.New(rand.NewPCG(1, 2))
	var live []string
	for step := range 2000 {
		switch rng.IntN(6) {
		case 0, 1:
			dev := fmt.Sprintf("eth1-q%d", rng.IntN(4))
			if a, err := l.Reserve(Reservation{Pool: "upf", Devices: []string{dev}}); err == nil {
				if rng.IntN(4) == 0 {
					l.Abort(a.ID)
				} else if err := l.Commit(a.ID, nil); err == nil {
					live = append(live, a.ID)
				}
			}
		case 2, 3:
			if len(live) > 0 {
				i := rng.IntN(len(live))
				free(t, l, live[i])
				live = slices.Delete(live, i, i+1)
			}
		case 4:
			l.SetPools([][]Pool{{big}, {small}, {small, other}, {other}}[rng.IntN(4)])
		case 5:
			l.Usage("dns")
		}
		for _, pool := range []string{"upf", "dns"} {
			got := l.Usage(pool)
			got.Blocked = ""
			l.mu.Lock()
			want := l.countLocked(pool)
			l.mu.Unlock()
			if got != want {
				t.Fatalf("step %d, pool %s: Usage %+v, counted %+v", step, pool, got, want)
			}
		}
	}
}

func TestPoolOfID(t *testing.T) {
	for id, want := range map[string]string{
		"upf-0123456789ab":     "upf",
		"my-pool-0123456789ab": "my-pool",
		"upf-0123":             "",
		"upf-0123456789zz":     "",
		"":                     "",
	} {
		if got := poolOfID(id); got != want {
			t.Errorf("poolOfID(%q) = %q, want %q", id, got, want)
		}
	}
}

// FuzzRecord: any bytes in a record file give an allocation that passes
// the record's checks, or an error; never a panic.
func FuzzRecord(f *testing.F) {
	f.Add([]byte(`{"version":1,"id":"upf-0123456789ab","pool":"upf","netdev":"eth1","queues":[0],"devices":["eth1-q0"],"state":"active"}`))
	f.Add([]byte(`{"version":1,"id":"upf-0123456789ab","pool":"upf","netdev":"eth1","queues":[0],"devices":["eth1-q0"],"state":"active",` +
		`"attachments":[{"containerID":"c","ifName":"net1","mode":"queue","state":"pending"}]}`))
	f.Add([]byte(`{"version":1`))
	f.Add([]byte(``))
	f.Fuzz(func(t *testing.T, b []byte) {
		dir := t.TempDir()
		s := &store{dir: dir}
		if err := os.WriteFile(s.path("upf-0123456789ab"), b, 0o600); err != nil {
			t.Fatal(err)
		}
		a, err := s.read("upf-0123456789ab")
		if err != nil {
			return
		}
		if a.ID != "upf-0123456789ab" || len(a.Devices) == 0 || (a.State != Active && a.State != Ending) {
			t.Fatalf("accepted %+v", a)
		}
		l := open(t, dir)
		if _, ok := l.Get(a.ID); !ok && len(l.Broken()) == 0 {
			t.Fatal("a readable record neither loaded nor reported")
		}
	})
}

// anyPodAllocation is a ledger in dir with an active allocation of queue
// eth1-q0 of pool upf that any pod may use.
func anyPodAllocation(t *testing.T, dir string) (*Ledger, Allocation) {
	t.Helper()
	l := open(t, dir)
	l.SetPools([]Pool{queuePool("upf", []string{"eth1"}, 0, 1)})
	a, err := l.Reserve(Reservation{Pool: "upf", Devices: []string{"eth1-q0"}, Owner: Owner{AnyPod: true}})
	if err != nil {
		t.Fatal(err)
	}
	if err := l.Commit(a.ID, nil); err != nil {
		t.Fatal(err)
	}
	return l, a
}

// TestEndAttachOwner: an attachment of a pod, once active, makes that pod
// the allocation's owner, in the same record write; a failed attachment
// leaves the owner as it was.
func TestEndAttachOwner(t *testing.T) {
	dir := t.TempDir()
	l, a := anyPodAllocation(t, dir)
	attach := func(container, pod string, ok bool) {
		t.Helper()
		att, _, err := l.BeginAttach(a.ID, Attachment{Attachment: api.Attachment{CNIAddRequest: api.CNIAddRequest{ContainerID: container, IfName: "net1", PodUID: pod}, Mode: api.ModeQueue}})
		if err != nil {
			t.Fatal(err)
		}
		if err := l.EndAttach(att, ok); err != nil {
			t.Fatal(err)
		}
	}
	attach("c0", "pod-b", false)
	if got, _ := l.Get(a.ID); got.Owner != (Owner{AnyPod: true}) {
		t.Errorf("after a failed attachment the owner is %+v", got.Owner)
	}
	attach("c1", "pod-a", true)
	if got, _ := open(t, dir).Get(a.ID); got.Owner != (Owner{PodUID: "pod-a"}) {
		t.Errorf("the owner read back after an attachment of pod-a: %+v", got.Owner)
	}
}

// TestCountAndAllocationsOf: Count counts what Allocations returns (no
// pending allocation), per pool too, and the attachments of those;
// AllocationsOf is Allocations of one pool, and names the pools when
// asked for one it does not have.
func TestCountAndAllocationsOf(t *testing.T) {
	l := open(t, t.TempDir())
	l.SetPools([]Pool{queuePool("upf", []string{"eth1"}, 0, 1, 2), queuePool("cp", []string{"eth2"}, 0, 1)})
	check := func(want Counts) {
		t.Helper()
		all := l.Allocations()
		c := l.Count()
		atts := 0
		for _, a := range all {
			atts += len(a.Attachments)
		}
		if c.Allocations != want.Allocations || c.Attachments != want.Attachments || fmt.Sprint(c.ByPool) != fmt.Sprint(want.ByPool) ||
			c.Allocations != len(all) || c.Attachments != atts {
			t.Errorf("count %+v, want %+v (Allocations has %d with %d attachments)", c, want, len(all), atts)
		}
		for _, p := range []string{"upf", "cp"} {
			of, err := l.AllocationsOf(p)
			if err != nil || len(of) != want.ByPool[p] || !slices.IsSortedFunc(of, func(a, b Allocation) int { return strings.Compare(a.ID, b.ID) }) {
				t.Errorf("AllocationsOf(%s): %d (%v), want %d by id", p, len(of), err, want.ByPool[p])
			}
			for _, a := range of {
				if a.Pool != p || a.State == Pending {
					t.Errorf("AllocationsOf(%s) has %+v", p, a)
				}
			}
		}
	}
	check(Counts{ByPool: map[string]int{}})
	a := alloc(t, l, "upf", "eth1-q0")
	b := alloc(t, l, "upf", "eth1-q1")
	alloc(t, l, "cp", "eth2-q0")
	attach(t, l, a.ID, "c1", "net1")
	attach(t, l, a.ID, "c1", "net2")
	attach(t, l, b.ID, "c2", "net1")
	if _, err := l.Reserve(Reservation{Pool: "upf", Devices: []string{"eth1-q2"}}); err != nil {
		t.Fatal(err) // pending: neither counted nor listed
	}
	check(Counts{Allocations: 3, Attachments: 3, ByPool: map[string]int{"upf": 2, "cp": 1}})
	free(t, l, a.ID)
	check(Counts{Allocations: 2, Attachments: 1, ByPool: map[string]int{"upf": 1, "cp": 1}})
	if _, err := l.AllocationsOf("nope"); !errors.Is(err, ErrNotFound) || err.Error() != `no pool "nope" (pools: cp, upf)` {
		t.Errorf("AllocationsOf(nope): %v", err)
	}
}

// TestBindOwner: pods binding an allocation any pod may use at the same
// moment: exactly one wins, the others get ErrConflict, binding again as
// the winner is a no-op, and the winner is what a reopened ledger reads.
func TestBindOwner(t *testing.T) {
	dir := t.TempDir()
	l, a := anyPodAllocation(t, dir)
	errs := make([]error, 8)
	var wg sync.WaitGroup
	for i := range errs {
		wg.Go(func() { errs[i] = l.BindOwner(a.ID, fmt.Sprintf("pod-%d", i)) })
	}
	wg.Wait()
	winner := -1
	for i, err := range errs {
		switch {
		case err == nil && winner < 0:
			winner = i
		case err == nil:
			t.Errorf("pods %d and %d both bound it", winner, i)
		case !errors.Is(err, ErrConflict):
			t.Errorf("pod %d: %v, want a conflict", i, err)
		}
	}
	if winner < 0 {
		t.Fatal("no pod bound it")
	}
	w := fmt.Sprintf("pod-%d", winner)
	if err := l.BindOwner(a.ID, w); err != nil {
		t.Errorf("the winner again: %v", err)
	}
	if got, _ := open(t, dir).Get(a.ID); got.Owner != (Owner{PodUID: w}) {
		t.Errorf("reopened, the owner is %+v, want %s", got.Owner, w)
	}
	if err := l.BindOwner("upf-none", w); !errors.Is(err, api.ErrNotFound) {
		t.Errorf("no such allocation: %v", err)
	}
}

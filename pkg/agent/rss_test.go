package agent_test

import (
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/xdpq/xdpq/pkg/agent"
)

// TestReserveRSS: the decisions of keeping RSS off the queues handed to
// pods, on the fake NIC without root. The host's buckets of a reserved
// queue are spread over the others in turn; the NIC's own table is saved
// the first time and every later reservation is computed from it (a
// queue no longer reserved gets its buckets back, a restarted agent
// does not take its predecessor's rewrite for the NIC's own), unless
// the table changed size (other channels); a reservation that would
// leave the host no queue is refused with the table untouched; none
// reserved puts the NIC's own table back and forgets it.
func TestReserveRSS(t *testing.T) {
	nic := newFakeNtupleNIC(4) // 128 buckets: 0 1 2 3 0 1 2 3 ...
	own := slices.Clone(nic.indir)
	state := filepath.Join(t.TempDir(), "agent", "eth1.rss.json")
	table := func() []uint32 {
		nic.mu.Lock()
		defer nic.mu.Unlock()
		return slices.Clone(nic.indir)
	}
	// count is how many buckets each queue has.
	count := func(tb []uint32) map[uint32]int {
		c := map[uint32]int{}
		for _, q := range tb {
			c[q]++
		}
		return c
	}

	if err := agent.ReserveRSS(nic, "eth1", state, []uint32{2, 3}); err != nil {
		t.Fatal(err)
	}
	if got := count(table()); len(got) != 2 || got[0] != 64 || got[1] != 64 {
		t.Errorf("buckets per queue with 2 and 3 reserved: %v, want 64 each on 0 and 1", got)
	}
	if got := table(); got[0] != 0 || got[1] != 1 || got[2] != 0 || got[3] != 1 || got[6] != 0 || got[7] != 1 {
		t.Errorf("the buckets of 2 and 3 go to 0 and 1 in turn, the others stay: %v", got[:8])
	}
	if _, err := os.Stat(state); err != nil {
		t.Errorf("the NIC's own table was not saved: %v", err)
	}

	// From the saved table, not the rewrite: queue 2 gets its own back.
	if err := agent.ReserveRSS(nic, "eth1", state, []uint32{3}); err != nil {
		t.Fatal(err)
	}
	tb := table()
	for i, q := range own {
		if q != 3 && tb[i] != q {
			t.Fatalf("bucket %d: queue %d, want its own %d back", i, tb[i], q)
		}
	}
	if got := count(tb); got[3] != 0 || got[2] < 32 {
		t.Errorf("buckets per queue with 3 reserved: %v", got)
	}

	// Every queue reserved: refused, the table as it was.
	before := table()
	if err := agent.ReserveRSS(nic, "eth1", state, []uint32{0, 1, 2, 3}); err == nil || !strings.Contains(err.Error(), "no queue would be left for the host") {
		t.Errorf("every queue reserved: %v", err)
	}
	if !slices.Equal(table(), before) {
		t.Error("a refused reservation changed the table")
	}

	// None reserved: the NIC's own table back, the saved one forgotten;
	// again, nothing to do.
	for range 2 {
		if err := agent.ReserveRSS(nic, "eth1", state, nil); err != nil {
			t.Fatal(err)
		}
		if !slices.Equal(table(), own) {
			t.Errorf("after the reservation ended: %v, want the NIC's own", table()[:8])
		}
		if _, err := os.Stat(state); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("the saved table after the reservation ended: %v", err)
		}
	}

	// The channels changed (a table of another size): the NIC's table
	// now is its own, not the saved one.
	if err := agent.ReserveRSS(nic, "eth1", state, []uint32{1}); err != nil {
		t.Fatal(err)
	}
	nic.mu.Lock()
	nic.indir = []uint32{0, 1, 0, 1, 0, 1, 0, 1}
	nic.mu.Unlock()
	if err := agent.ReserveRSS(nic, "eth1", state, []uint32{1}); err != nil {
		t.Fatal(err)
	}
	if got := table(); !slices.Equal(got, []uint32{0, 0, 0, 0, 0, 0, 0, 0}) {
		t.Errorf("after a resize: %v, want every bucket on queue 0", got)
	}
	if err := agent.ReserveRSS(nic, "eth1", state, nil); err != nil {
		t.Fatal(err)
	}
	if got := table(); !slices.Equal(got, []uint32{0, 1, 0, 1, 0, 1, 0, 1}) {
		t.Errorf("restored after a resize: %v, want the resized NIC's own", got)
	}

	// A saved table that cannot be read is not guessed at.
	if err := os.WriteFile(state, []byte("{"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := agent.ReserveRSS(nic, "eth1", state, []uint32{1}); err == nil || !strings.Contains(err.Error(), "remove the file") {
		t.Errorf("a corrupt saved table: %v; want it refused, saying what to do", err)
	}
}

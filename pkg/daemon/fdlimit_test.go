package daemon

import (
	"io"
	"log/slog"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/xdpq/xdpq/internal/testing/coretest"
	"github.com/xdpq/xdpq/pkg/ledger"
)

// TestFDLimitDecisions: the reconciler raises the descriptor limit to
// what the pools' devices may need (a base, and two per device) as far
// as the hard limit lets it, and says in status when that is not enough;
// it leaves a limit that is enough alone, and asks the kernel again only
// when the need changes. In this process as any user: raising the soft
// limit up to the hard one needs no privilege (the hard limit, which
// cannot be raised back, is left as it is). TestFDLimit runs a daemon
// under prlimit for a hard limit too low, as root.
func TestFDLimitDecisions(t *testing.T) {
	var orig unix.Rlimit
	if err := unix.Getrlimit(unix.RLIMIT_NOFILE, &orig); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Setrlimit(unix.RLIMIT_NOFILE, &orig) })
	soft := func(cur uint64) {
		t.Helper()
		if err := unix.Setrlimit(unix.RLIMIT_NOFILE, &unix.Rlimit{Cur: cur, Max: orig.Max}); err != nil {
			t.Fatal(err)
		}
	}
	now := func() uint64 {
		var rl unix.Rlimit
		if err := unix.Getrlimit(unix.RLIMIT_NOFILE, &rl); err != nil {
			t.Fatal(err)
		}
		if rl.Max != orig.Max {
			t.Fatalf("the hard limit changed: %d, was %d", rl.Max, orig.Max)
		}
		return rl.Cur
	}
	pools := func(devices int) []ledger.Pool {
		return []ledger.Pool{{Name: "a", Devices: coretest.Queues("xa", devices/2)}, {Name: "b", Devices: coretest.Queues("xb", devices-devices/2)}}
	}
	r := &reconciler{log: slog.New(slog.NewTextHandler(io.Discard, nil))}
	check := func(devices int) {
		t.Helper()
		need := uint64(fdsBase + fdsPerDevice*devices)
		problem := r.fitFDLimit(pools(devices))
		switch got := now(); {
		case orig.Max >= need && (got != need || problem != ""):
			t.Errorf("%d devices: limit %d, %q; want %d and no problem", devices, got, problem, need)
		case orig.Max < need && (got != orig.Max || !strings.Contains(problem, "is below the")):
			t.Errorf("%d devices under a hard limit of %d: limit %d, %q; want the hard limit and the problem said", devices, orig.Max, got, problem)
		}
	}
	soft(1050)
	check(8)
	// The same need: nothing asked of the kernel, even though the limit
	// was lowered meanwhile (only the reconciler sets it).
	soft(1050)
	if problem := r.fitFDLimit(pools(8)); problem != "" && orig.Max >= uint64(fdsBase+fdsPerDevice*8) {
		t.Errorf("the same pools again: %q", problem)
	}
	if got := now(); got != 1050 {
		t.Errorf("the same pools again: limit %d; want it left at 1050", got)
	}
	// More devices: raised again.
	check(16)
	// Enough already: left as it is.
	high := min(orig.Max, uint64(fdsBase+fdsPerDevice*32)+100)
	soft(high)
	if problem := r.fitFDLimit(pools(20)); problem != "" && high >= uint64(fdsBase+fdsPerDevice*20) {
		t.Errorf("a limit that is enough: %q", problem)
	}
	if got := now(); got != high {
		t.Errorf("a limit that is enough: %d; want it left at %d", got, high)
	}
}

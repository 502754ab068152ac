package daemon

import (
	"fmt"

	"golang.org/x/sys/unix"

	"github.com/xdpq/xdpq/pkg/broker"
	"github.com/xdpq/xdpq/pkg/ledger"
)

// What the daemon may hold open: per device (an allocation holds at
// least one) its allocation's listening socket and one more while a
// lease's sockets are handed over; the broker's connections in a
// handshake or being refused, all allocations together
// (broker.DefaultMaxConnections); and a base for the agent's maps and
// links, the API, the device plugins and the log.
const (
	fdsPerDevice = 2
	fdsBase      = 1024 + broker.DefaultMaxConnections
)

// fitFDLimit raises the daemon's descriptor limit to what pools may need,
// as far as the kernel lets it (the hard limit too with
// CAP_SYS_RESOURCE), and says so. Without the room, a flood of connections
// could make accept fail with EMFILE (the broker backs off and goes on,
// but the owners wait). It returns a problem for status while the limit
// stays below the need. Only the reconciler calls it.
func (r *reconciler) fitFDLimit(pools []ledger.Pool) string {
	devices := 0
	for _, p := range pools {
		devices += len(p.Devices)
	}
	need := uint64(fdsBase + fdsPerDevice*devices)
	if need == r.fdNeed {
		return r.fdProblem
	}
	r.fdNeed, r.fdProblem = need, ""
	var rl unix.Rlimit
	if err := unix.Getrlimit(unix.RLIMIT_NOFILE, &rl); err != nil {
		r.fdProblem = fmt.Sprintf("descriptor limit: %v", err)
		return r.fdProblem
	}
	if rl.Cur >= need {
		return ""
	}
	from := rl.Cur
	want := unix.Rlimit{Cur: need, Max: max(rl.Max, need)}
	if err := unix.Setrlimit(unix.RLIMIT_NOFILE, &want); err != nil {
		// Without CAP_SYS_RESOURCE the hard limit stays: take what it allows.
		want = unix.Rlimit{Cur: rl.Max, Max: rl.Max}
		if err := unix.Setrlimit(unix.RLIMIT_NOFILE, &want); err != nil {
			r.fdProblem = fmt.Sprintf("descriptor limit: %v", err)
			return r.fdProblem
		}
	}
	if want.Cur < need {
		r.fdProblem = fmt.Sprintf("descriptor limit %d is below the %d that %d devices may need (%d each and %d); "+
			"raise the daemon's hard limit (LimitNOFILE, ulimit -Hn) or give it CAP_SYS_RESOURCE", want.Cur, need, devices, fdsPerDevice, fdsBase)
		r.log.Warn("descriptor limit below the pools' need", "limit", want.Cur, "need", need, "devices", devices)
		return r.fdProblem
	}
	r.log.Info("descriptor limit raised for the pools", "from", from, "to", want.Cur, "devices", devices)
	return ""
}

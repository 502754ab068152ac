package daemon

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/xdpq/xdpq/internal/testing/handover"
	"github.com/xdpq/xdpq/pkg/client"
	"github.com/xdpq/xdpq/pkg/kubepods"
)

// TestUninstallWaitsForClaims: helm uninstall while a claim is prepared.
// kubelet unprepares a claim through the driver only: a daemon that
// frees it and goes leaves the claim's pod Terminating for good ("DRA
// driver xdpq.io is not registered") and its CDI spec on the node. The
// daemon keeps serving the claim (its pod keeps its lease), prepares
// nothing new, and finishes the uninstall once kubelet has unprepared
// it: nothing of xdpq stays. A claim not unprepared within
// DRA.UninstallWait is freed anyway, its CDI spec removed with it.
// (Before, the uninstall freed the claim at once and left the spec.)
func TestUninstallWaitsForClaims(t *testing.T) {
	const uid = "e1000000-0000-4000-8000-000000000001"
	for _, tc := range []struct {
		name    string
		wait    time.Duration
		kubelet bool // kubelet unprepares the claim during the wait
	}{
		{"unprepared", time.Hour, true},
		{"not in time", time.Millisecond, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			held := allocatedClaim("held", uid, podA, []string{"xa-q2"}, "")
			later := allocatedClaim("later", "e1000000-0000-4000-8000-000000000002", podA, []string{"xa-q3"}, "")
			var calls int
			e := newDRAEnvWith(t, newFakePods(kubepods.Pod{UID: podA, Namespace: "default", Name: "dns-0"}),
				"pools: [{name: dns, servedBy: dra, steering: software, devices: {netdevs: ['xa#2-3']}}]\n",
				func(o *Options) { o.Uninstalling = uninstallAnswer(true, &calls); o.DRA.UninstallWait = tc.wait }, held, later)
			if r := e.prepare(t, held); r.Error != "" {
				t.Fatal(r.Error)
			}
			a, _ := e.d.core.ledger.ByClaim(uid)
			leave := joinCgroup(t, handover.PodCgroup(t, container, podA))
			l, err := client.Connect(filepath.Join(e.opts.AllocDir, a.ID, "xdpq.sock"), client.Options{Ring: 256, Timeout: 5 * time.Second})
			leave()
			if err != nil {
				t.Fatal(err)
			}
			defer l.Close()
			spec := filepath.Join(e.cdiDir, "xdpq.io-claim_"+uid+".json")
			if !exists(spec) {
				t.Fatalf("no CDI spec %s", spec)
			}
			stopped := make(chan struct{})
			go func() { e.stop(); close(stopped) }()
			if !tc.kubelet {
				<-stopped
			} else {
				waitFor(t, "the uninstall to begin", e.d.core.isUninstalling)
				if r := e.prepare(t, later); !strings.Contains(r.Error, "being uninstalled") {
					t.Errorf("a claim prepared during the uninstall: %+v", r)
				}
				select {
				case <-stopped:
					t.Fatal("the daemon stopped with a claim prepared")
				default:
				}
				if a, ok := e.d.core.ledger.ByClaim(uid); !ok || len(a.Lease) == 0 {
					t.Errorf("the claim's allocation during the uninstall: %+v %v; want it leased still", a, ok)
				}
				if msg := e.unprepare(t, held); msg != "" {
					t.Fatalf("kubelet's unprepare during the uninstall: %s", msg)
				}
				select {
				case <-stopped:
				case <-time.After(time.Minute):
					t.Fatal("the daemon did not stop once the claim was unprepared")
				}
			}
			if calls != 1 {
				t.Errorf("Uninstalling asked %d times, want once", calls)
			}
			if exists(spec) {
				t.Error("the claim's CDI spec stays after the uninstall")
			}
			for _, dir := range []string{e.opts.PinDir, e.opts.StateDir, e.opts.AllocDir} {
				if exists(dir) {
					ents, _ := os.ReadDir(dir)
					t.Errorf("%s stays after the uninstall (%d entries)", dir, len(ents))
				}
			}
		})
	}
}

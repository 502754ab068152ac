package daemon

import (
	"context"
	"errors"
	"os"
	"strings"
	"time"

	"github.com/xdpq/xdpq/pkg/api"
	"github.com/xdpq/xdpq/pkg/config"
	"github.com/xdpq/xdpq/pkg/ledger"
)

// uninstallTimeout bounds the removal of the datapath on uninstall. The
// chart's terminationGracePeriodSeconds must leave it room.
const uninstallTimeout = 20 * time.Second

// errUninstalling refuses what would put something new on the node while
// the daemon removes what it put there.
var errUninstalling = api.Errorf(api.ErrUnavailable, "xdpq is being uninstalled from this node")

// isUninstalling reports whether uninstall has begun.
func (c *core) isUninstalling() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.uninstalling
}

// stopping runs when Run's context ends, before the parts stop: it asks
// Options.Uninstalling and, if xdpq is being uninstalled and the daemon
// had started, removes what it put on the node while the reconciler still
// runs. Otherwise (a restart, an update, a node shutdown) everything
// stays for the next daemon to adopt.
func (d *Daemon) stopping(ctx context.Context) {
	if d.opts.Uninstalling == nil {
		return
	}
	actx, cancel := context.WithTimeout(context.WithoutCancel(ctx), uninstallTimeout)
	yes, why := d.opts.Uninstalling(actx)
	cancel()
	if !yes {
		d.log.Info("stopping; the datapath stays for the next daemon", "reason", why)
		return
	}
	if !d.core.started() {
		d.log.Warn("uninstalled before the daemon had started: what a previous daemon left stays", "reason", why)
		return
	}
	d.log.Info("xdpq is being uninstalled: removing its datapath from the node", "reason", why)
	d.core.refuseNew()
	d.awaitUnprepare(ctx)
	actx, cancel = context.WithTimeout(context.WithoutCancel(ctx), uninstallTimeout)
	defer cancel()
	err := d.core.uninstall(actx)
	if d.opts.DRA != nil {
		d.dra.RemoveStaleSpecs()
	}
	if err != nil {
		d.log.Error("uninstall left something on the node; its records and pins stay, so that a new install adopts it or an operator can remove it", "err", err)
		return
	}
	d.log.Info("uninstalled: no allocation, flow, program or netdev of xdpq remains on the node")
}

// refuseNew has the core take nothing new from now on: an uninstall
// has begun.
func (c *core) refuseNew() {
	c.mu.Lock()
	c.uninstalling = true
	c.mu.Unlock()
}

// isUninstalled reports whether uninstall removed everything but the
// files (close removes them).
func (c *core) isUninstalled() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.uninstalled
}

// claimsHeld are the claims (namespace/name) whose allocations remain.
func (c *core) claimsHeld() []string {
	var held []string
	for _, a := range c.ledger.Allocations() {
		if a.Claim != nil {
			held = append(held, a.Claim.Namespace+"/"+a.Claim.Name)
		}
	}
	return held
}

// awaitUnprepare waits, up to DRA.UninstallWait, for kubelet to unprepare
// the claims still prepared: kubelet unprepares a claim through the
// driver only, so one freed by the uninstall instead would leave its pod
// Terminating for good (kubelet: "DRA driver xdpq.io is not registered")
// and its CDI spec on the node. Their pods keep their queues until then;
// no claim is prepared and no allocation made meanwhile.
func (d *Daemon) awaitUnprepare(ctx context.Context) {
	if d.opts.DRA == nil || d.opts.DRA.UninstallWait <= 0 || len(d.core.claimsHeld()) == 0 {
		return
	}
	end := time.Now().Add(d.opts.DRA.UninstallWait)
	deadline := time.NewTimer(time.Until(end))
	defer deadline.Stop()
	tell := time.NewTicker(30 * time.Second)
	defer tell.Stop()
	said := ""
	for {
		held := d.core.claimsHeld()
		if len(held) == 0 {
			d.log.Info("uninstall: kubelet unprepared every claim")
			return
		}
		if s := strings.Join(held, " "); s != said {
			said = s
			d.log.Warn("uninstall waits for kubelet to unprepare the claims still prepared: delete their pods",
				"claims", held, "until", end.Format(time.RFC3339))
		}
		select {
		case <-d.dra.Unprepared():
		case <-tell.C:
			said = "" // said again, as a reminder
		case <-deadline.C:
			d.log.Error("uninstall: claims not unprepared in time are freed now; their pods stay Terminating until xdpq is installed again and kubelet can unprepare them",
				"claims", held, "waited", d.opts.DRA.UninstallWait)
			return
		case <-ctx.Done():
			return
		}
	}
}

// uninstall ends every allocation (their attachments undone, netdevs in
// pods returned, leases ended, sockets removed; the device-info files and
// CDI specs go with the faces that wrote them),
// then puts an empty config in force, which unmanages every netdev (flows,
// RSS reservations and busy-poll settings restored, programs detached,
// pins removed) and stops the device plugins. What remains on disk (the
// records, the pin and allocation directories) close removes.
func (c *core) uninstall(ctx context.Context) error {
	c.mu.Lock()
	c.uninstalling = true
	c.mu.Unlock()
	var errs []error
	for _, a := range c.ledger.Allocations() {
		var err error
		switch {
		case a.State == ledger.Ending:
			err = c.finishFree(ctx, a, "xdpq uninstalled")
		default:
			err = c.free(ctx, a.ID, "xdpq uninstalled")
		}
		if err != nil {
			errs = append(errs, err)
		}
	}
	if err := c.rec.request(ctx, reconcileRequest{cfg: &config.Config{}}); err != nil {
		errs = append(errs, err)
	}
	// With no pool, what is not in force is what could not be removed (a
	// netdev's program, flows or pins the agent failed to take away).
	problems := c.rec.inForce()
	for _, p := range problems {
		errs = append(errs, errors.New(p))
	}
	if err := errors.Join(errs...); err != nil {
		return err
	}
	c.mu.Lock()
	c.uninstalled = true
	c.mu.Unlock()
	return nil
}

// removeState removes, once everything is released, what the daemon kept
// on disk: its records and the agent's state, the allocations' directory
// and its pins. It runs only after a complete uninstall, with the state
// directory's lock still held.
func (c *core) removeState() {
	for _, dir := range []string{c.opts.AllocDir, c.pinRoot(), c.opts.StateDir} {
		if err := os.RemoveAll(dir); err != nil {
			c.log.Warn("uninstall: remove", "dir", dir, "err", err)
		}
	}
}

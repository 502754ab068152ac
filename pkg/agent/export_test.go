package agent

import "time"

// SetClock makes the agent read the time of linger periods from now.
func SetClock(a *Agent, now func() time.Time) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.now = now
}

// ReconcileNow runs the periodic resync's reconcile of every netdev now,
// and returns when it is done.
func (a *Agent) ReconcileNow() { a.reconcileAll(true) }

// HardwareSteering is one netdev's hardware steering (ntuple rules and
// RSS contexts) on dev alone, without an agent: the tests of its
// decisions run on a fake NIC without root, which an agent (its pins on
// a bpffs, its programs) needs.
type HardwareSteering struct{ s *steering }

// NewHardwareSteering is the steering an agent makes for a netdev of
// queues queues whose policy has hardware steering in rules.
func NewHardwareSteering(dev NtupleDevice, ifname string, rules RuleRange, queues int) *HardwareSteering {
	return &HardwareSteering{&steering{mode: SteerHardware, dev: dev, ifname: ifname, rules: rules, queues: queues,
		owners: map[string][]installed{}}}
}

func (h *HardwareSteering) Add(owner string, flows []Flow) error { return h.s.add(owner, flows) }
func (h *HardwareSteering) RemoveOwner(owner string) error       { return h.s.removeOwner(owner) }
func (h *HardwareSteering) Verify(owner string) error            { return h.s.verify(owner) }
func (h *HardwareSteering) Repair() (map[string]int, error)      { return h.s.repair() }
func (h *HardwareSteering) SetRange(r RuleRange) error           { return h.s.setRange(r) }
func (h *HardwareSteering) Sync(keep map[string][]Flow, keepUnknown bool) (int, error) {
	return h.s.sync(keep, keepUnknown)
}

// ReserveRSS keeps RSS off reserved queues of ifname on dev, saving the
// NIC's own table in stateFile, as an agent does for a policy's
// Reserved.
func ReserveRSS(dev NtupleDevice, ifname, stateFile string, reserved []uint32) error {
	return reserveRSS(dev, ifname, stateFile, reserved)
}

// NormalizePolicy checks p and fills in its defaults as an agent whose
// Config.Linger is linger does before any kernel work.
func NormalizePolicy(p Policy, linger time.Duration) (Policy, error) {
	return (&Agent{cfg: Config{Linger: linger}}).normalize(p)
}

// SteeringChoice is what an agent on dev decides of a netdev's steering:
// auto resolved by probing the NIC's ntuple filters, and what hardware
// steering lacks there, given the queues reserved off RSS (asked) and
// those the NIC's table keeps off (inForce).
func SteeringChoice(dev NtupleDevice, name string, s Steering, asked, inForce []uint32) (Steering, string, error) {
	a := &Agent{nic: dev}
	mode, err := a.resolveSteering(name, s)
	if err != nil {
		return "", "", err
	}
	d := &netdev{name: name, steer: &steering{mode: mode}, policy: Policy{Reserved: inForce}}
	return mode, a.hardwareGaps(d, asked), nil
}

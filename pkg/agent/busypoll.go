package agent

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"

	"github.com/xdpq/xdpq/internal/atomicfile"
	"github.com/xdpq/xdpq/pkg/nic"
)

// busyPollNAPI are the NAPI settings of Policy.BusyPoll, the values of
// the kernel's example for preferred busy polling: NAPI re-polls from its
// timer twice before it turns the interrupt back on, and an application
// that has not polled for 200 µs loses the queue back to interrupts.
var busyPollNAPI = nic.NAPIConfig{DeferHardIRQs: 2, GROFlushTimeout: 200_000}

func (a *Agent) napiFile(name string) string {
	return filepath.Join(a.cfg.StateDir, name+".napi.json")
}

// syncBusyPoll gives the netdev (managed as name, called ifname now) the
// busy polling NAPI settings when want, saving its own first unless they
// are saved already (by this agent or a predecessor: those are the
// netdev's own); without want, it puts saved settings back and forgets
// them. It tells whether the busy polling settings are in force after.
//
// The settings are the netdev's sysfs attributes, through a sysfs of the
// agent's namespace (Config.SysRoot): see nic.Sysfs.SetNAPI for why not
// netdev-genl's per-NAPI napi-set.
func (a *Agent) syncBusyPoll(name, ifname string, want bool) (bool, error) {
	file := a.napiFile(name)
	b, err := os.ReadFile(file)
	saved := err == nil
	if err != nil && !os.IsNotExist(err) {
		return false, fmt.Errorf("saved napi settings of %s: %w", name, err)
	}
	if !want && !saved {
		return false, nil
	}
	sys, err := a.sysfs()
	if err != nil {
		return saved, err
	}
	if want {
		if !saved {
			own, err := sys.NAPI(ifname)
			if err != nil {
				return false, err
			}
			b, _ := json.Marshal(own)
			if err := os.MkdirAll(a.cfg.StateDir, 0o700); err != nil {
				return false, fmt.Errorf("save napi settings of %s: %w", name, err)
			}
			if err := atomicfile.WriteFile(file, b, 0o600); err != nil {
				return false, fmt.Errorf("save napi settings of %s: %w", name, err)
			}
		}
		if err := sys.SetNAPI(ifname, busyPollNAPI); err != nil {
			return false, err
		}
		return true, nil
	}
	var own nic.NAPIConfig
	if err := json.Unmarshal(b, &own); err != nil {
		return true, fmt.Errorf("saved napi settings of %s in %s: %w (write the netdev's own values back by hand, then remove the file)", name, file, err)
	}
	if err := sys.SetNAPI(ifname, own); err != nil {
		return true, err
	}
	if err := atomicfile.Remove(file); err != nil {
		return false, fmt.Errorf("forget the saved napi settings of %s: %w", name, err)
	}
	a.log.Info("napi settings put back", "netdev", name, "napi_defer_hard_irqs", own.DeferHardIRQs,
		"gro_flush_timeout", own.GROFlushTimeout)
	return false, nil
}

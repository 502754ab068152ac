package cluster

import (
	"fmt"
	"os/exec"
	"path/filepath"
	"strings"
)

// OperatorXDP attaches obj's section xdp to dev natively, forced over
// whatever is there (an operator's own program taking the hook), or with
// obj "" removes whatever is attached; as ip(8) does it, in the named
// network namespace netns ("" for the caller's).
func OperatorXDP(netns, dev, obj string) error {
	var args []string
	if netns != "" {
		args = append(args, "-n", filepath.Base(netns))
	}
	args = append(args, "-force", "link", "set", "dev", dev, "xdpdrv")
	if obj != "" {
		args = append(args, "obj", obj, "sec", "xdp")
	} else {
		args = append(args, "off")
	}
	if out, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
		return fmt.Errorf("ip %s: %w: %s", strings.Join(args, " "), err, out)
	}
	return nil
}

// RSS reserved: the NIC's indirection table keeps the queues handed to
// pods out of RSS, and gives it back as it was (its state file).

package agent

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"

	"github.com/xdpq/xdpq/internal/atomicfile"
)

// reserveRSS rewrites the NIC's RSS indirection table so that no hash
// bucket points at a reserved queue: the host's own traffic then never
// lands on a queue the direct program hands to a pod. The table is
// computed from the NIC's own, saved in stateFile the first time (a
// predecessor's save is the NIC's own, not its rewrite), so a queue no
// longer reserved gets its buckets back. With no queue reserved, the
// saved table is put back.
func reserveRSS(dev NtupleDevice, ifname, stateFile string, reserved []uint32) error {
	if len(reserved) == 0 {
		return restoreRSS(dev, ifname, stateFile)
	}
	orig, err := loadRSS(ifname, stateFile)
	if err != nil {
		return err
	}
	table, err := dev.Indirection(ifname)
	if err != nil {
		return fmt.Errorf("keep rss off queues %v of %s: %w", reserved, ifname, err)
	}
	if len(orig) != len(table) {
		// Nothing saved, or the table changed size since (other channels):
		// the NIC's table now is its own.
		orig = table
		b, _ := json.Marshal(table)
		if err := os.MkdirAll(filepath.Dir(stateFile), 0o700); err != nil {
			return fmt.Errorf("save rss table of %s: %w", ifname, err)
		}
		if err := atomicfile.WriteFile(stateFile, b, 0o600); err != nil {
			return fmt.Errorf("save rss table of %s: %w", ifname, err)
		}
	}
	var spread []uint32
	for _, q := range orig {
		if !slices.Contains(reserved, q) && !slices.Contains(spread, q) {
			spread = append(spread, q)
		}
	}
	slices.Sort(spread)
	if len(spread) == 0 {
		return fmt.Errorf("keep rss off queues %v of %s: no queue would be left for the host", reserved, ifname)
	}
	out := make([]uint32, len(orig))
	j := 0
	for i, q := range orig {
		if slices.Contains(reserved, q) {
			q = spread[j%len(spread)]
			j++
		}
		out[i] = q
	}
	if slices.Equal(out, table) {
		return nil
	}
	return dev.SetIndirection(ifname, out)
}

// loadRSS reads the table reserveRSS saved; nil when there is none.
func loadRSS(ifname, stateFile string) ([]uint32, error) {
	b, err := os.ReadFile(stateFile)
	if os.IsNotExist(err) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("saved rss table of %s: %w", ifname, err)
	}
	var table []uint32
	if err := json.Unmarshal(b, &table); err != nil {
		return nil, fmt.Errorf("saved rss table of %s in %s: %w (remove the file to take the table the NIC has now as its own)", ifname, stateFile, err)
	}
	return table, nil
}

// restoreRSS puts back the table reserveRSS saved.
func restoreRSS(dev NtupleDevice, ifname, stateFile string) error {
	table, err := loadRSS(ifname, stateFile)
	if err != nil || table == nil {
		return err
	}
	if err := dev.SetIndirection(ifname, table); err != nil {
		return fmt.Errorf("restore rss table of %s: %w", ifname, err)
	}
	return atomicfile.Remove(stateFile)
}

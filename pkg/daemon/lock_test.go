package daemon

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestLocks: one daemon per state, pin and allocation directory. A
// second lock of a directory is refused, naming the holder (its pid,
// and for the pin and allocation directories its command line, from
// /proc/locks) and the flag that gives the second daemon another
// directory; the lock goes with its holder's release, and the next
// daemon takes it. Locks of different directories do not meet. As any
// user: flock is the kernel's for anyone, and two open files of one
// process conflict as two daemons' do. TestSecondDaemon and
// TestSecondDaemonOnPins refuse whole daemons, as root.
func TestLocks(t *testing.T) {
	pid := fmt.Sprintf("pid %d", os.Getpid())
	for _, c := range []struct {
		name string
		lock func(dir string) (func(), error)
		says []string
	}{
		{"state directory", lockStateDir, []string{"another xdpq daemon (" + pid + ") runs on the state directory", "--state-dir"}},
		{"pin directory", lockPinDir, []string{"another xdpq daemon (" + pid + ": ", "manages the pin directory", "--pin-dir"}},
		{"allocation directory", lockAllocDir, []string{"another xdpq daemon (" + pid + ": ", "manages the allocation directory", "--alloc-dir"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			dir, other := filepath.Join(t.TempDir(), "d"), filepath.Join(t.TempDir(), "d")
			for _, d := range []string{dir, other} {
				if err := os.MkdirAll(d, 0o700); err != nil {
					t.Fatal(err)
				}
			}
			release, err := c.lock(dir)
			if err != nil {
				t.Fatal(err)
			}
			_, err = c.lock(dir)
			if err == nil {
				t.Fatal("a second lock was taken")
			}
			for _, s := range append(c.says, dir) {
				if !strings.Contains(err.Error(), s) {
					t.Errorf("the refusal %q does not say %q", err, s)
				}
			}
			releaseOther, err := c.lock(other)
			if err != nil {
				t.Fatalf("another directory: %v", err)
			}
			releaseOther()
			release()
			again, err := c.lock(dir)
			if err != nil {
				t.Fatalf("once released: %v", err)
			}
			again()
		})
	}
}

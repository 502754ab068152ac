package cni

import (
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/containernetworking/cni/pkg/skel"
	"github.com/containernetworking/cni/pkg/types"
	"github.com/containernetworking/plugins/pkg/ipam"
)

// TestDelWithoutDaemon: a DEL the daemon does not answer releases the
// pod's host-local lease and succeeds only when xdpq was uninstalled
// (its socket absent, the socket's directory empty or gone); while the
// daemon restarts (its state still beside the socket) or after it
// crashed (its socket left, nobody listening) DEL fails with the daemon's
// error and keeps the lease and the cache file for the runtime's retry.
// It needs no root: host-local keeps its leases in a directory of the
// test's, and no daemon runs.
func TestDelWithoutDaemon(t *testing.T) {
	bin := t.TempDir()
	build(t, bin, map[string]string{"host-local": "github.com/containernetworking/plugins/plugins/ipam/host-local"})
	// As a runtime runs the plugin: IPAM is found on CNI_PATH, and
	// host-local reads the attachment from the environment.
	t.Setenv("CNI_PATH", bin)
	t.Setenv("CNI_CONTAINERID", "ctr1")
	t.Setenv("CNI_IFNAME", "net1")
	t.Setenv("CNI_NETNS", "/var/run/netns/xdpq-test-none")
	t.Setenv("CNI_ARGS", "")

	for _, tc := range []struct {
		name string
		// node makes the socket's directory (run) as the case has it and
		// returns the socket's path.
		node     func(t *testing.T, run string) string
		released bool
		details  string // in the error's details when not released
	}{
		{name: "uninstalled: no directory", released: true,
			node: func(t *testing.T, run string) string { return filepath.Join(run, "xdpq", "xdpq-api.sock") }},
		{name: "uninstalled: empty directory", released: true,
			node: func(t *testing.T, run string) string {
				mkdir(t, filepath.Join(run, "xdpq"))
				return filepath.Join(run, "xdpq", "xdpq-api.sock")
			}},
		{name: "restarting: state beside the socket", details: "still holds its state (agent)",
			node: func(t *testing.T, run string) string {
				mkdir(t, filepath.Join(run, "xdpq", "agent"))
				return filepath.Join(run, "xdpq", "xdpq-api.sock")
			}},
		{name: "crashed: socket nobody listens on", details: "connection refused",
			node: func(t *testing.T, run string) string {
				mkdir(t, filepath.Join(run, "xdpq"))
				return staleSocket(t, filepath.Join(run, "xdpq", "xdpq-api.sock"))
			}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			socket := tc.node(t, filepath.Join(dir, "run"))
			leases := filepath.Join(dir, "leases")
			conf := []byte(fmt.Sprintf(`{"cniVersion":"1.1.0","name":"upf","type":"xdpq","daemonSocket":%q,
				"ipam":{"type":"host-local","subnet":"10.77.0.0/24","dataDir":%q}}`, socket, leases))
			if _, err := ipam.ExecAdd("host-local", conf); err != nil {
				t.Fatalf("host-local ADD: %v", err)
			}
			if l := ipamLeases(t, leases); len(l) != 1 {
				t.Fatalf("leases after ADD %v, want one", l)
			}
			// What ADD would have cached.
			p := Plugin{CacheDir: filepath.Join(dir, "cache")}
			args := &skel.CmdArgs{ContainerID: "ctr1", IfName: "net1", Netns: "/var/run/netns/xdpq-test-none", StdinData: conf}
			mkdir(t, p.CacheDir)
			if err := os.WriteFile(p.cachePath(args), conf, 0o600); err != nil {
				t.Fatal(err)
			}

			err := p.Del(args)
			_, cacheErr := os.Stat(p.cachePath(args))
			l := ipamLeases(t, leases)
			if tc.released {
				if err != nil {
					t.Fatalf("DEL: %v, want success", err)
				}
				if len(l) != 0 || !errors.Is(cacheErr, os.ErrNotExist) {
					t.Errorf("leases %v and cache file (stat: %v) left, want none", l, cacheErr)
				}
				// Again, as a runtime may: still nothing to do.
				if err := p.Del(args); err != nil {
					t.Errorf("second DEL: %v", err)
				}
				return
			}
			var te *types.Error
			if !errors.As(err, &te) || te.Code != ErrDaemon || !strings.Contains(te.Details, tc.details) {
				t.Fatalf("DEL: %v, want the daemon's error (code %d) saying %q", err, ErrDaemon, tc.details)
			}
			if len(l) != 1 || cacheErr != nil {
				t.Errorf("leases %v, cache file stat: %v; want the lease and the cache file kept for the retry", l, cacheErr)
			}
		})
	}
}

func mkdir(t *testing.T, dir string) {
	t.Helper()
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
}

// staleSocket leaves at path the socket of a daemon that died: bound, no
// longer listened on.
func staleSocket(t *testing.T, path string) string {
	t.Helper()
	l, err := net.ListenUnix("unix", &net.UnixAddr{Name: path, Net: "unix"})
	if err != nil {
		t.Fatal(err)
	}
	l.SetUnlinkOnClose(false)
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	return path
}

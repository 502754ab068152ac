package config

import (
	"context"
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// TestWatcher: a valid change is applied, an invalid one refused with the
// last good config kept, and SIGHUP reloads. It also follows a ConfigMap
// style symlink swap.
func TestWatcher(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "config.yaml")
	write := func(s string) {
		t.Helper()
		tmp := filepath.Join(dir, "tmp")
		if err := os.WriteFile(tmp, []byte(s), 0o644); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(tmp, path); err != nil {
			t.Fatal(err)
		}
	}
	write("pools: [{name: a, devices: {netdevs: [eth1#8-15]}}]")
	var mu sync.Mutex
	var applied []string
	apply := func(c *Config) error {
		mu.Lock()
		defer mu.Unlock()
		var names []string
		for _, p := range c.Pools {
			names = append(names, p.Name)
		}
		applied = append(applied, strings.Join(names, ","))
		if len(names) > 0 && names[len(names)-1] == "refuse-me" {
			return errors.New("the daemon cannot apply this")
		}
		return nil
	}
	w, err := NewWatcher(path, apply, slog.New(slog.NewTextHandler(t.Output(), nil)))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error)
	go func() { done <- w.Run(ctx) }()
	defer func() { cancel(); <-done }()
	waitFor := func(what string, f func() bool) {
		t.Helper()
		deadline := time.Now().Add(5 * time.Second)
		for !f() {
			if time.Now().After(deadline) {
				mu.Lock()
				defer mu.Unlock()
				t.Fatalf("%s: applied %v, last error %v", what, applied, w.LastError())
			}
			time.Sleep(5 * time.Millisecond)
		}
	}
	lastApplied := func() string {
		mu.Lock()
		defer mu.Unlock()
		return applied[len(applied)-1]
	}

	write("pools: [{name: a, devices: {netdevs: [eth1#8-15]}}, {name: b, devices: {netdevs: [eth2#0-3]}}]")
	waitFor("valid change", func() bool { return lastApplied() == "a,b" })

	write("pools: [{name: a, devices: {netdevs: [eth1#8-15]}, bogus: 1}]")
	waitFor("invalid change", func() bool { return w.LastError() != nil })
	if !strings.Contains(w.LastError().Error(), "pools[0].bogus: unknown field") || len(w.Current().Pools) != 2 {
		t.Fatalf("after an invalid file: %v, %d pools in force", w.LastError(), len(w.Current().Pools))
	}

	write("pools: [{name: refuse-me, devices: {netdevs: [eth1#8-15]}}]")
	waitFor("unappliable change", func() bool { return w.LastError() != nil && strings.Contains(w.LastError().Error(), "cannot apply") })
	if len(w.Current().Pools) != 2 {
		t.Fatal("a config the daemon refused took effect")
	}

	// A ConfigMap volume: config.yaml -> ..data/config.yaml, ..data a symlink swapped atomically.
	os.Remove(path)
	os.MkdirAll(filepath.Join(dir, "v1"), 0o755)
	os.WriteFile(filepath.Join(dir, "v1", "config.yaml"), []byte("pools: [{name: c, devices: {netdevs: [eth3#1]}}]"), 0o644)
	os.Symlink("v1", filepath.Join(dir, "..data_tmp"))
	os.Rename(filepath.Join(dir, "..data_tmp"), filepath.Join(dir, "..data"))
	os.Symlink("..data/config.yaml", path)
	waitFor("symlink swap", func() bool { return lastApplied() == "c" })

	// SIGHUP reloads even without a file event: change the target behind
	// a directory the watcher does not see.
	os.WriteFile(filepath.Join(dir, "v1", "config.yaml"), []byte("pools: [{name: d, devices: {netdevs: [eth4#1]}}]"), 0o644)
	syscall.Kill(os.Getpid(), syscall.SIGHUP)
	waitFor("SIGHUP", func() bool { return lastApplied() == "d" && w.LastError() == nil })

	if _, err := NewWatcher(filepath.Join(dir, "missing.yaml"), apply, nil); err == nil {
		t.Error("a missing file was accepted")
	}
}

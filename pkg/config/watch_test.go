package config

import (
	"context"
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
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
	w, err := NewWatcher(path, slog.New(slog.NewTextHandler(t.Output(), nil)))
	if err != nil {
		t.Fatal(err)
	}
	if err := apply(w.Current()); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error)
	go func() { done <- w.Run(ctx, apply) }()
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
	r := w.Reloads()
	if r.Succeeded != 1 || r.Failed != 2 || r.LastSuccess.IsZero() {
		t.Errorf("reloads %+v, want 1 succeeded and 2 failed", r)
	}

	// A ConfigMap volume: config.yaml -> ..data/config.yaml, ..data a symlink swapped atomically.
	os.Remove(path)
	if err := os.MkdirAll(filepath.Join(dir, "v1"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "v1", "config.yaml"), []byte("pools: [{name: c, devices: {netdevs: [eth3#1]}}]"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("v1", filepath.Join(dir, "..data_tmp")); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(filepath.Join(dir, "..data_tmp"), filepath.Join(dir, "..data")); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("..data/config.yaml", path); err != nil {
		t.Fatal(err)
	}
	waitFor("symlink swap", func() bool { return lastApplied() == "c" })

	// Reload (what SIGHUP does in cmd/deviceplugin) reads the file even
	// without a file event: change the target behind a directory the
	// watcher does not see. It applies an unchanged file too.
	if err := os.WriteFile(filepath.Join(dir, "v1", "config.yaml"), []byte("pools: [{name: d, devices: {netdevs: [eth4#1]}}]"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := w.Reload(ctx); err != nil || lastApplied() != "d" || w.LastError() != nil {
		t.Fatalf("reload: %v, applied %s, last error %v", err, lastApplied(), w.LastError())
	}
	mu.Lock()
	n := len(applied)
	mu.Unlock()
	if err := w.Reload(ctx); err != nil || len(applied) != n+1 {
		t.Fatalf("reload of an unchanged file: %v, %d applies, want %d", err, len(applied), n+1)
	}
	if r2 := w.Reloads(); r2.Succeeded < r.Succeeded+3 || !r2.LastSuccess.After(r.LastSuccess) {
		t.Errorf("reloads %+v after the swap and two Reloads; were %+v", r2, r)
	}

	if _, err := NewWatcher(filepath.Join(dir, "missing.yaml"), nil); err == nil {
		t.Error("a missing file was accepted")
	}
}

// TestWatcherApplyCallsBack: apply may ask the watcher for its state while
// a Reload waits (the daemon's status does, from another goroutine, at
// any time). A watcher that held its lock across apply deadlocked here.
func TestWatcherApplyCallsBack(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "config.yaml")
	if err := os.WriteFile(path, []byte("pools: [{name: a, devices: {netdevs: [eth1#8-15]}}]"), 0o644); err != nil {
		t.Fatal(err)
	}
	w, err := NewWatcher(path, slog.New(slog.NewTextHandler(t.Output(), nil)))
	if err != nil {
		t.Fatal(err)
	}
	var statusMu sync.Mutex // stands for the daemon's lock
	apply := func(*Config) error {
		statusMu.Lock()
		defer statusMu.Unlock()
		return nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	done := make(chan error)
	go func() { done <- w.Run(ctx, apply) }()
	var wg sync.WaitGroup
	for range 4 {
		wg.Add(1)
		go func() { // status: the daemon's lock, then the watcher's
			defer wg.Done()
			for i := 0; i < 500 && ctx.Err() == nil; i++ {
				statusMu.Lock()
				w.LastError()
				w.Current()
				statusMu.Unlock()
			}
		}()
	}
	for i := 0; i < 200; i++ {
		if err := w.Reload(ctx); err != nil {
			t.Fatalf("reload %d: %v", i, err)
		}
	}
	wg.Wait()
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

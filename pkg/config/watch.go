package config

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"path/filepath"
	"sync"
	"syscall"
	"time"

	"github.com/fsnotify/fsnotify"
)

// Watcher keeps the config of a file in force: it reloads the file when it
// changes and on SIGHUP, applies a valid new config, and keeps the last
// good one when the new one is invalid or cannot be applied.
type Watcher struct {
	path  string
	apply func(*Config) error
	log   *slog.Logger
	fw    *fsnotify.Watcher
	hup   chan os.Signal

	mu      sync.Mutex // guards the fields below
	current *Config
	raw     []byte
	lastErr error
}

// NewWatcher loads path, which must be valid, and applies it. From then
// on changes and SIGHUP are noticed; Run acts on them.
func NewWatcher(path string, apply func(*Config) error, log *slog.Logger) (*Watcher, error) {
	if log == nil {
		log = slog.Default()
	}
	w := &Watcher{path: path, apply: apply, log: log, hup: make(chan os.Signal, 1)}
	if err := w.Reload(); err != nil {
		return nil, err
	}
	fw, err := fsnotify.NewWatcher()
	if err != nil {
		return nil, fmt.Errorf("watch %s: %w", path, err)
	}
	if err := fw.Add(filepath.Dir(path)); err != nil {
		fw.Close()
		return nil, fmt.Errorf("watch %s: %w", path, err)
	}
	w.fw = fw
	signal.Notify(w.hup, syscall.SIGHUP)
	return w, nil
}

// Current returns the config in force.
func (w *Watcher) Current() *Config {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.current
}

// LastError returns why the last reload was refused, or nil when the file
// on disk is the config in force.
func (w *Watcher) LastError() error {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.lastErr
}

// Reload reads the file again. An unchanged file does nothing; an invalid
// one is refused, logged and kept as LastError, and the config in force
// stays.
func (w *Watcher) Reload() error {
	raw, err := os.ReadFile(w.path)
	w.mu.Lock()
	defer w.mu.Unlock()
	if err == nil && w.current != nil && bytes.Equal(raw, w.raw) {
		return nil
	}
	var c *Config
	if err == nil {
		c, err = Parse(raw)
	}
	if err == nil {
		if aerr := w.apply(c); aerr != nil {
			err = fmt.Errorf("apply config: %w", aerr)
		}
	}
	if err != nil {
		w.lastErr = fmt.Errorf("%s: %w", w.path, err)
		if w.current != nil {
			w.log.Error("config refused; the last good one stays in force", "path", w.path, "err", err)
		}
		return w.lastErr
	}
	w.current, w.raw, w.lastErr = c, raw, nil
	w.log.Info("config in force", "path", w.path, "pools", len(c.Pools))
	return nil
}

// Run reloads on changes to the file (watched through its directory, as
// a Kubernetes ConfigMap volume swaps a symlink) and on SIGHUP, until ctx
// ends; then it stops watching.
func (w *Watcher) Run(ctx context.Context) error {
	fw, hup := w.fw, w.hup
	defer fw.Close()
	defer signal.Stop(hup)
	// Editors and ConfigMap updates write in several steps: settle first.
	var settle <-chan time.Time
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-hup:
			w.log.Info("SIGHUP: reloading config", "path", w.path)
			w.Reload()
		case ev, ok := <-fw.Events:
			if !ok {
				return fmt.Errorf("watch %s: closed", w.path)
			}
			if ev.Op&(fsnotify.Write|fsnotify.Create|fsnotify.Rename|fsnotify.Remove) != 0 {
				settle = time.After(100 * time.Millisecond)
			}
		case err, ok := <-fw.Errors:
			if !ok {
				return fmt.Errorf("watch %s: closed", w.path)
			}
			w.log.Error("watch config", "path", w.path, "err", err)
		case <-settle:
			settle = nil
			w.Reload()
		}
	}
}

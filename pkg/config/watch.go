package config

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/fsnotify/fsnotify"
)

// Watcher keeps the config of a file in force. NewWatcher loads the first
// one; Run applies every later version of the file (watched through its
// directory, as a Kubernetes ConfigMap volume swaps a symlink) and every
// Reload. An invalid file, or one the apply function refuses, leaves the
// last good config in force and is kept as LastError.
//
// Only Run's goroutine calls apply, and it holds no lock of the watcher
// while it does: apply may call Current or LastError, and a caller of
// those never waits for an apply. The watcher registers no signal
// handler; the program decides what SIGHUP means (cmd/deviceplugin calls
// Reload).
type Watcher struct {
	// OnRefused, if set before Run, is told of each refusal (on Run's
	// goroutine, no lock of the watcher held): the same error LastError
	// then returns. It must not block.
	OnRefused func(error)

	path   string
	log    *slog.Logger
	reload chan chan error

	mu      sync.Mutex // guards the fields below, never held across apply
	current *Config
	raw     []byte
	lastErr error
	reloads Reloads
}

// Reloads counts a watcher's reloads: each time it read the file after
// NewWatcher and put it in force or refused it. A file read again
// unchanged, without Reload, is no reload.
type Reloads struct {
	Succeeded, Failed uint64
	// LastSuccess is when the config in force was put in force: when
	// NewWatcher loaded it, for the first.
	LastSuccess time.Time
}

// NewWatcher loads path, which must hold a valid config; it becomes
// Current, to be put in force by the caller before Run starts.
func NewWatcher(path string, log *slog.Logger) (*Watcher, error) {
	if log == nil {
		log = slog.Default()
	}
	raw, c, err := load(path)
	if err != nil {
		return nil, err
	}
	return &Watcher{path: path, log: log, reload: make(chan chan error), current: c, raw: raw, reloads: Reloads{LastSuccess: time.Now()}}, nil
}

func load(path string) ([]byte, *Config, error) {
	raw, err := os.ReadFile(path)
	if err != nil {
		return nil, nil, err // names the path
	}
	c, err := Parse(raw)
	if err != nil {
		return raw, nil, fmt.Errorf("%s: %w", path, err)
	}
	return raw, c, nil
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

// Hash returns the SHA-256 of the file in force, hex: the same on every
// node that runs the same config.
func (w *Watcher) Hash() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	sum := sha256.Sum256(w.raw)
	return hex.EncodeToString(sum[:])
}

// Reloads returns the count of reloads so far.
func (w *Watcher) Reloads() Reloads {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.reloads
}

// Reload has Run read the file now and apply it even when it has not
// changed (the program's own state may have: SIGHUP is how an operator
// says so), and returns the outcome. It waits for Run; it returns ctx's
// error if ctx ends first.
func (w *Watcher) Reload(ctx context.Context) error {
	done := make(chan error, 1)
	select {
	case w.reload <- done:
	case <-ctx.Done():
		return ctx.Err()
	}
	select {
	case err := <-done:
		return err
	case <-ctx.Done():
		return ctx.Err()
	}
}

// ErrWatchClosed is returned by Run when the file system watch ends on its
// own.
var ErrWatchClosed = errors.New("config watch closed")

// Run applies the file whenever it changes and on Reload, until ctx ends.
func (w *Watcher) Run(ctx context.Context, apply func(*Config) error) error {
	fw, err := fsnotify.NewWatcher()
	if err != nil {
		return fmt.Errorf("watch %s: %w", w.path, err)
	}
	defer func() { _ = fw.Close() }() // an inotify fd that only reads: closing it loses nothing
	if err := fw.Add(filepath.Dir(w.path)); err != nil {
		return fmt.Errorf("watch %s: %w", w.path, err)
	}
	// The file may have changed between NewWatcher and the watch. apply
	// logs a refusal and keeps it for Status; the last good config stays.
	_ = w.apply(apply, false)
	// Editors and ConfigMap updates write in several steps: settle first.
	var settle <-chan time.Time
	for {
		select {
		case <-ctx.Done():
			return nil
		case done := <-w.reload:
			done <- w.apply(apply, true)
		case ev, ok := <-fw.Events:
			if !ok {
				return fmt.Errorf("%s: %w", w.path, ErrWatchClosed)
			}
			if ev.Op&(fsnotify.Write|fsnotify.Create|fsnotify.Rename|fsnotify.Remove) != 0 {
				settle = time.After(100 * time.Millisecond)
			}
		case err, ok := <-fw.Errors:
			if !ok {
				return fmt.Errorf("%s: %w", w.path, ErrWatchClosed)
			}
			w.log.Error("watch config", "path", w.path, "err", err)
		case <-settle:
			settle = nil
			_ = w.apply(apply, false) // logged and kept for Status by apply
		}
	}
}

// apply reads the file and, when it changed or force is set, applies it.
func (w *Watcher) apply(apply func(*Config) error, force bool) error {
	raw, c, err := load(w.path)
	w.mu.Lock()
	same := err == nil && bytes.Equal(raw, w.raw)
	if same && !force {
		w.lastErr = nil
	}
	w.mu.Unlock()
	if same && !force {
		return nil
	}
	if err == nil {
		if aerr := apply(c); aerr != nil {
			err = fmt.Errorf("%s: apply: %w", w.path, aerr)
		}
	}
	if err != nil {
		w.mu.Lock()
		w.lastErr = err
		w.reloads.Failed++
		w.mu.Unlock()
		w.log.Error("config refused; the last good one stays in force", "err", err)
		if w.OnRefused != nil {
			w.OnRefused(err)
		}
		return err
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	w.current, w.raw, w.lastErr = c, raw, nil
	w.reloads.Succeeded++
	w.reloads.LastSuccess = time.Now()
	w.log.Info("config in force", "path", w.path, "pools", len(c.Pools))
	return nil
}

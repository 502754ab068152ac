package kubebin

import (
	"bytes"
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
)

// hello is a table of one small program, keyed by the version of
// k8s.io/kubernetes as the real ones are.
func hello() map[string]binary {
	return map[string]binary{"hello": {pkg: "./testdata/hello", module: "k8s.io/kubernetes", ldflags: kubeVersion}}
}

// syncBuffer is a bytes.Buffer safe for concurrent builds' progress.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// TestEnsureBuildsOnceAndCaches builds a program into an empty cache
// (removing what a killed build left there), runs it, and finds it in
// the cache the second time, named by name, module version and go
// version.
func TestEnsureBuildsOnceAndCaches(t *testing.T) {
	dir := t.TempDir()
	stale := filepath.Join(dir, tempPrefix+"hello.123")
	if err := os.WriteFile(stale, []byte("half a binary"), 0o644); err != nil {
		t.Fatal(err)
	}
	var progress syncBuffer
	opts := Options{Dir: dir, Progress: &progress}
	paths, err := ensure(context.Background(), opts, hello(), []string{"hello"})
	if err != nil {
		t.Fatal(err)
	}
	goVersion, err := exec.Command("go", "env", "GOVERSION").Output()
	if err != nil {
		t.Fatal(err)
	}
	want := filepath.Join(dir, "hello-v1.37.2-"+strings.TrimSpace(string(goVersion)))
	if paths["hello"] != want {
		t.Errorf("path %s, want %s", paths["hello"], want)
	}
	out, err := exec.Command(paths["hello"]).Output()
	if err != nil || string(out) != "hello\n" {
		t.Errorf("run %s: %q, %v", paths["hello"], out, err)
	}
	if _, err := os.Stat(stale); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("a killed build's temporary file: %v, want removed", err)
	}
	if !strings.Contains(progress.String(), "kubebin: building hello v1.37.2") || !strings.Contains(progress.String(), "kubebin: built hello in") {
		t.Errorf("progress %q does not say what it builds and how long it took", progress.String())
	}

	var again syncBuffer
	opts.Progress = &again
	paths2, err := ensure(context.Background(), opts, hello(), []string{"hello"})
	if err != nil {
		t.Fatal(err)
	}
	if paths2["hello"] != want || again.String() != "" {
		t.Errorf("second Ensure: %v, progress %q; want the cached %s without a build", paths2, again.String(), want)
	}
	assertOnly(t, dir, filepath.Base(want), lockPrefix+"hello")
}

// TestEnsureConcurrent runs Ensure four times at once on an empty cache:
// one builds, the others wait for its lock and take its binary.
func TestEnsureConcurrent(t *testing.T) {
	dir := t.TempDir()
	var progress syncBuffer
	var wg sync.WaitGroup
	paths := make([]Paths, 4)
	errs := make([]error, 4)
	for i := range paths {
		wg.Go(func() {
			paths[i], errs[i] = ensure(context.Background(), Options{Dir: dir, Progress: &progress}, hello(), []string{"hello"})
		})
	}
	wg.Wait()
	for i := range paths {
		if errs[i] != nil {
			t.Fatal(errs[i])
		}
		if paths[i]["hello"] != paths[0]["hello"] {
			t.Errorf("Ensure %d: %s, Ensure 0: %s", i, paths[i]["hello"], paths[0]["hello"])
		}
	}
	if n := strings.Count(progress.String(), "kubebin: built hello"); n != 1 {
		t.Errorf("built %d times, want once:\n%s", n, progress.String())
	}
}

// TestEnsureCancelled cancels a build as it starts: no binary, no
// temporary file.
func TestEnsureCancelled(t *testing.T) {
	dir := t.TempDir()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	w := cancelOnWrite{cancel: cancel}
	_, err := ensure(ctx, Options{Dir: dir, Progress: w}, hello(), []string{"hello"})
	if !errors.Is(err, context.Canceled) {
		t.Errorf("cancelled build: %v, want context.Canceled", err)
	}
	assertOnly(t, dir, lockPrefix+"hello")
}

type cancelOnWrite struct{ cancel func() }

func (c cancelOnWrite) Write(p []byte) (int, error) {
	if bytes.Contains(p, []byte("building")) {
		c.cancel()
	}
	return len(p), nil
}

// TestEnsureErrors: an unknown name and a directory outside the e2e
// module get errors that say what to do.
func TestEnsureErrors(t *testing.T) {
	_, err := Ensure(context.Background(), Options{Dir: t.TempDir()}, "kube-proxy")
	if err == nil || !strings.Contains(err.Error(), `unknown binary "kube-proxy"`) || !strings.Contains(err.Error(), "kubelet") {
		t.Errorf("unknown name: %v", err)
	}
	_, err = Ensure(context.Background(), Options{Dir: t.TempDir(), ModuleDir: "../../.."}, Kubectl)
	if err == nil || !strings.Contains(err.Error(), "run in the e2e module") {
		t.Errorf("outside the module: %v", err)
	}
}

func assertOnly(t *testing.T, dir string, names ...string) {
	t.Helper()
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, e := range entries {
		got = append(got, e.Name())
	}
	slices.Sort(names)
	if !slices.Equal(got, names) {
		t.Errorf("cache holds %q, want %q", got, names)
	}
}

// TestSourceHash: a program of the repository's own (kubesd) is cached
// under a hash of its module's files, which changes with any of its Go
// files, go.mod or go.sum, and not with another file.
func TestSourceHash(t *testing.T) {
	dir := t.TempDir()
	write := func(name, text string) {
		t.Helper()
		if err := os.WriteFile(filepath.Join(dir, name), []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	hash := func() string {
		t.Helper()
		h, err := sourceHash(dir)
		if err != nil {
			t.Fatal(err)
		}
		return h
	}
	write("go.mod", "module example.com/x\n")
	write("main.go", "package main\n\nfunc main() {}\n")
	first := hash()
	write("README", "not source")
	if h := hash(); h != first {
		t.Fatalf("hash %s after a README was added, want %s", h, first)
	}
	for _, f := range []string{"main.go", "go.mod", "go.sum"} {
		before := hash()
		write(f, "changed\n")
		if h := hash(); h == before {
			t.Fatalf("hash %s unchanged after %s changed", h, f)
		}
	}
	if _, err := sourceHash(filepath.Join(dir, "missing")); err == nil {
		t.Fatal("hash of a missing directory: no error")
	}
}

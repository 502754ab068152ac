// Package kubebin builds the programs of a test cluster (etcd, the
// Kubernetes components, kubectl and helm) from the Go modules the e2e
// module pins with its tool directives, once, into a cache outside the
// repository.
//
// A cached binary is named <name>-<module version>-<go version>, so a
// change of either builds it again and never reuses a stale one (a
// program of the repository's own, kubesd, has a hash of its files
// beside its module's version). A
// binary is built under a temporary name in the cache directory and
// renamed into place: a killed build leaves no half-written binary
// under a cached name (its temporary file is removed by the next
// Ensure). Builds of a binary in concurrent processes (go test runs
// packages in parallel) are serialised by a lock file of the binary in
// the cache directory, so the second waits for the first and finds its
// binary there.
//
// A fresh build of everything takes about 12 minutes on two cores;
// Ensure says which binary it builds and, every 30 seconds, for how long.
package kubebin

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"time"
)

// Names of the binaries Ensure builds.
const (
	Etcd                  = "etcd"
	KubeAPIServer         = "kube-apiserver"
	KubeControllerManager = "kube-controller-manager"
	KubeScheduler         = "kube-scheduler"
	Kubelet               = "kubelet"
	Kubectl               = "kubectl"
	Helm                  = "helm"
	// The node's container runtime: containerd 2 (CDI, which DRA
	// drivers need, and the runtime kubelet 1.36+ supports), its runc
	// shim and its CLI.
	Containerd     = "containerd"
	ContainerdShim = "containerd-shim-runc-v2"
	Ctr            = "ctr"
	// Prometheus's Kubernetes service discovery, which Debian's
	// Prometheus server lacks, as a program of its own that feeds the
	// server's file discovery (kubebin/kubesd): the e2e scrapes the
	// daemons as the chart's ServiceMonitor says.
	KubeSD = "kubesd"
)

// DefaultCacheDir is where binaries are cached unless XDPQ_E2E_CACHE
// names another directory.
const DefaultCacheDir = "/var/cache/xdpq-e2e"

// CacheEnv is the environment variable that overrides DefaultCacheDir.
const CacheEnv = "XDPQ_E2E_CACHE"

// progressEvery is how often a running build reports that it still runs.
const progressEvery = 30 * time.Second

// binary says how one program is built.
type binary struct {
	pkg    string // its main package
	module string // the module whose version keys the cache
	// dir is the module it is built in, relative to the e2e module's
	// directory; "" is the e2e module.
	dir string
	// source: the program is dir's own code, so its cache key has a hash
	// of dir's files beside module's version.
	source bool
	// tags are its build tags.
	tags []string
	// ldflags: -X settings of the version a program reports (an ad-hoc
	// go build leaves the Kubernetes components at v0.0.0-master).
	ldflags func(version string) []string
}

// binaries returns how each program is built. Its packages are the
// e2e module's tool directives.
func binaries() map[string]binary {
	kube := func(pkg string) binary {
		return binary{pkg: pkg, module: "k8s.io/kubernetes", ldflags: kubeVersion}
	}
	return map[string]binary{
		Etcd:                  {pkg: "go.etcd.io/etcd/server/v3", module: "go.etcd.io/etcd/server/v3"},
		KubeAPIServer:         kube("k8s.io/kubernetes/cmd/kube-apiserver"),
		KubeControllerManager: kube("k8s.io/kubernetes/cmd/kube-controller-manager"),
		KubeScheduler:         kube("k8s.io/kubernetes/cmd/kube-scheduler"),
		Kubelet:               kube("k8s.io/kubernetes/cmd/kubelet"),
		Kubectl:               kube("k8s.io/kubernetes/cmd/kubectl"),
		Helm: {pkg: "helm.sh/helm/v4/cmd/helm", module: "helm.sh/helm/v4", ldflags: func(v string) []string {
			return []string{"-X", "helm.sh/helm/v4/internal/version.version=" + v}
		}},
		Containerd:     containerd("github.com/containerd/containerd/v2/cmd/containerd"),
		ContainerdShim: containerd("github.com/containerd/containerd/v2/cmd/containerd-shim-runc-v2"),
		Ctr:            containerd("github.com/containerd/containerd/v2/cmd/ctr"),
		// In a module of its own, as containerd; a few of Prometheus's
		// packages and client-go, where a whole Prometheus server built
		// with Kubernetes discovery only took 4 minutes of a cold 2-core
		// machine.
		KubeSD: {pkg: ".", module: "github.com/prometheus/prometheus", dir: "kubebin/kubesd", source: true},
	}
}

// containerd is how a program of containerd's module is built: in a
// module of its own (kubebin/containerd), so that its dependencies do not
// change the Kubernetes binaries', without the snapshotters the node
// does not use (their C libraries), and reporting its version.
func containerd(pkg string) binary {
	return binary{pkg: pkg, module: "github.com/containerd/containerd/v2", dir: "kubebin/containerd",
		tags: []string{"no_btrfs", "no_devmapper", "no_zfs"}, ldflags: func(v string) []string {
			return []string{"-X", "github.com/containerd/containerd/v2/version.Version=" + v}
		}}
}

// kubeVersion returns the -X settings of k8s.io/component-base/version
// for a Kubernetes version such as v1.37.2.
func kubeVersion(v string) []string {
	const pkg = "k8s.io/component-base/version."
	major, minor, _ := strings.Cut(strings.TrimPrefix(v, "v"), ".")
	minor, _, _ = strings.Cut(minor, ".")
	return []string{
		"-X", pkg + "gitVersion=" + v,
		"-X", pkg + "gitMajor=" + major,
		"-X", pkg + "gitMinor=" + minor,
		"-X", pkg + "gitTreeState=clean",
	}
}

// All returns the names of every binary Ensure can build.
func All() []string { return append(Node(), KubeSD) }

// Node returns the names of the binaries every e2e test's node needs: all
// but kubesd, which only the scenario that scrapes needs (it builds it
// or waits for another process's build).
func Node() []string {
	return []string{Etcd, KubeAPIServer, KubeControllerManager, KubeScheduler, Kubelet, Kubectl, Helm, Containerd, ContainerdShim, Ctr}
}

// Options configure Ensure. The zero value builds with the go command
// on PATH in the current directory's module into CacheDir().
type Options struct {
	// Dir is the cache directory; "" is CacheDir().
	Dir string
	// ModuleDir is a directory of the e2e module; "" is the current
	// directory (a test's is its package's).
	ModuleDir string
	// Go is the go command; "" is "go" on PATH.
	Go string
	// Progress receives one line per step of a build; nil is os.Stderr.
	Progress io.Writer
}

// CacheDir returns the cache directory: $XDPQ_E2E_CACHE or
// DefaultCacheDir.
func CacheDir() string {
	if d := os.Getenv(CacheEnv); d != "" {
		return d
	}
	return DefaultCacheDir
}

// Paths maps a binary's name to the path of its cached executable.
type Paths map[string]string

// Ensure returns the paths of the named binaries, building those not in
// the cache yet.
func Ensure(ctx context.Context, opts Options, names ...string) (Paths, error) {
	return ensure(ctx, opts, binaries(), names)
}

func ensure(ctx context.Context, opts Options, all map[string]binary, names []string) (Paths, error) {
	if opts.Dir == "" {
		opts.Dir = CacheDir()
	}
	if opts.Go == "" {
		opts.Go = "go"
	}
	if opts.Progress == nil {
		opts.Progress = os.Stderr
	}
	for _, n := range names {
		if _, ok := all[n]; !ok {
			known := slices.Sorted(maps.Keys(all))
			return nil, fmt.Errorf("kubebin: unknown binary %q (known: %s)", n, strings.Join(known, ", "))
		}
	}
	if err := os.MkdirAll(opts.Dir, 0o755); err != nil {
		return nil, fmt.Errorf("kubebin: cache directory: %w (set %s to another)", err, CacheEnv)
	}
	goVersion, versions, err := moduleVersions(ctx, opts, names, all)
	if err != nil {
		return nil, err
	}
	paths := make(Paths, len(names))
	keys := make(map[string]string, len(names))
	var missing []string
	for _, n := range names {
		keys[n] = versions[all[n].module]
		if all[n].source {
			h, err := sourceHash(all[n].dir)
			if err != nil {
				return nil, err
			}
			keys[n] += "-" + h
		}
		paths[n] = filepath.Join(opts.Dir, fmt.Sprintf("%s-%s-%s", n, keys[n], goVersion))
		if !executable(paths[n]) {
			missing = append(missing, n)
		}
	}
	if len(missing) == 0 {
		return paths, nil
	}

	start := time.Now()
	built := 0
	for _, n := range missing {
		ok, err := buildLocked(ctx, opts, n, all[n], keys[n], paths[n])
		if err != nil {
			return nil, err
		}
		if ok {
			built++
		}
	}
	if built > 1 {
		fmt.Fprintf(opts.Progress, "kubebin: built %d binaries in %s\n", built, time.Since(start).Round(time.Second))
	}
	return paths, nil
}

// moduleVersions returns the go command's version and the version of
// each module the named binaries come from, as the e2e module pins them.
func moduleVersions(ctx context.Context, opts Options, names []string, all map[string]binary) (string, map[string]string, error) {
	out, err := goCmd(ctx, opts, "env", "GOVERSION", "GOMOD").Output()
	if err != nil {
		return "", nil, fmt.Errorf("kubebin: go env: %w", exitDetail(err))
	}
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	if len(lines) != 2 || lines[0] == "" {
		return "", nil, fmt.Errorf("kubebin: go env printed %q", out)
	}
	goVersion, gomod := lines[0], lines[1]
	if !strings.HasSuffix(filepath.ToSlash(gomod), "test/e2e/go.mod") {
		return "", nil, fmt.Errorf("kubebin: run in the e2e module (test/e2e), not in %q", gomod)
	}
	// A binary built in a module of its own is built in its directory,
	// found from the e2e module's (the caller may be in a package's).
	for n, b := range all {
		if b.dir != "" && !filepath.IsAbs(b.dir) {
			b.dir = filepath.Join(filepath.Dir(gomod), b.dir)
			all[n] = b
		}
	}
	// Each module directory says the versions of the modules built in it.
	byDir := map[string][]string{}
	seen := map[string]bool{}
	for _, n := range names {
		b := all[n]
		if !seen[b.dir+" "+b.module] {
			seen[b.dir+" "+b.module] = true
			byDir[b.dir] = append(byDir[b.dir], b.module)
		}
	}
	versions := map[string]string{}
	for _, dir := range slices.Sorted(maps.Keys(byDir)) {
		cmd := goCmd(ctx, opts, append([]string{"list", "-m", "-f", "{{.Path}} {{.Version}}"}, byDir[dir]...)...)
		if dir != "" {
			cmd.Dir = dir
		}
		out, err = cmd.Output()
		if err != nil {
			return "", nil, fmt.Errorf("kubebin: go list -m in %s: %w", cmd.Dir, exitDetail(err))
		}
		sc := bufio.NewScanner(bytes.NewReader(out))
		for sc.Scan() {
			path, version, ok := strings.Cut(sc.Text(), " ")
			if !ok || version == "" {
				return "", nil, fmt.Errorf("kubebin: go list -m printed %q: is the module in test/e2e/%s/go.mod?", sc.Text(), dir)
			}
			versions[path] = version
		}
		for _, m := range byDir[dir] {
			if versions[m] == "" {
				return "", nil, fmt.Errorf("kubebin: no version of %s in the module test/e2e/%s", m, dir)
			}
		}
	}
	return goVersion, versions, nil
}

// sourceHash returns a short hash of the files of the module in dir
// (not of its subdirectories): its go.mod, go.sum and Go files.
func sourceHash(dir string) (string, error) {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return "", fmt.Errorf("kubebin: %w", err)
	}
	h := sha256.New()
	for _, e := range entries {
		n := e.Name()
		if !e.Type().IsRegular() || n != "go.mod" && n != "go.sum" && !strings.HasSuffix(n, ".go") {
			continue
		}
		b, err := os.ReadFile(filepath.Join(dir, n))
		if err != nil {
			return "", fmt.Errorf("kubebin: %w", err)
		}
		h.Write(fmt.Appendf(nil, "%s %d\n", n, len(b)))
		h.Write(b)
	}
	return hex.EncodeToString(h.Sum(nil))[:12], nil
}

// buildLocked builds b into dst under dst's lock, unless another
// process built it while this one waited for the lock. It removes what
// a killed build of the binary left.
func buildLocked(ctx context.Context, opts Options, name string, b binary, version, dst string) (bool, error) {
	unlock, err := lock(ctx, opts, name)
	if err != nil {
		return false, err
	}
	defer unlock()
	if executable(dst) {
		return false, nil
	}
	removeTemps(opts.Dir, name)
	var ldflags []string
	if b.ldflags != nil {
		ldflags = b.ldflags(version)
	}
	return true, build(ctx, opts, name, b, version, ldflags, dst)
}

// build builds pkg into dst through a temporary file in dst's directory,
// reporting progress.
func build(ctx context.Context, opts Options, name string, b binary, version string, ldflags []string, dst string) error {
	pkg := b.pkg
	tmp, err := os.CreateTemp(filepath.Dir(dst), tempPrefix+name+".")
	if err != nil {
		return fmt.Errorf("kubebin: build %s: %w", name, err)
	}
	_ = tmp.Close() // only its name is used: go build writes the file
	// Once renamed there is nothing to remove; a file a failed build
	// left, the next build's removeTemps removes.
	defer func() { _ = os.Remove(tmp.Name()) }()

	fmt.Fprintf(opts.Progress, "kubebin: building %s %s (%s) into %s\n", name, version, pkg, filepath.Dir(dst))
	start := time.Now()
	args := []string{"build", "-trimpath", "-o", tmp.Name(), "-ldflags", strings.Join(append([]string{"-s", "-w"}, ldflags...), " ")}
	if len(b.tags) > 0 {
		args = append(args, "-tags", strings.Join(b.tags, ","))
	}
	args = append(args, pkg)
	cmd := goCmd(ctx, opts, args...)
	if b.dir != "" {
		cmd.Dir = b.dir
	}
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("kubebin: build %s: %w", name, err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	tick := time.NewTicker(progressEvery)
	defer tick.Stop()
	for {
		select {
		case <-tick.C:
			fmt.Fprintf(opts.Progress, "kubebin: building %s, %s\n", name, time.Since(start).Round(time.Second))
			continue
		case err = <-done:
		}
		break
	}
	if ctx.Err() != nil {
		return fmt.Errorf("kubebin: build %s: %w", name, ctx.Err())
	}
	if err != nil {
		return fmt.Errorf("kubebin: go %s: %w\n%s", strings.Join(args, " "), err, out.Bytes())
	}
	if err := commit(tmp.Name(), dst); err != nil {
		return fmt.Errorf("kubebin: build %s: %w", name, err)
	}
	fmt.Fprintf(opts.Progress, "kubebin: built %s in %s\n", name, time.Since(start).Round(time.Second))
	return nil
}

// commit makes tmp executable, flushes it and renames it to dst, then
// flushes the directory, so dst is either absent or whole.
func commit(tmp, dst string) error {
	f, err := os.OpenFile(tmp, os.O_RDWR, 0)
	if err != nil {
		return err
	}
	err = f.Chmod(0o755)
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return err
	}
	if err := os.Rename(tmp, dst); err != nil {
		return err
	}
	d, err := os.Open(filepath.Dir(dst))
	if err != nil {
		return err
	}
	defer func() { _ = d.Close() }() // read-only; its sync is checked
	return d.Sync()
}

// Hidden files of the cache directory: a build's temporary file is
// .tmp-<name>.<random>, a binary's lock .lock-<name>.
const (
	tempPrefix = ".tmp-"
	lockPrefix = ".lock-"
)

// lock takes the lock of a binary's builds, waiting for another
// process's build of it, and returns its release.
func lock(ctx context.Context, opts Options, name string) (func(), error) {
	f, err := os.OpenFile(filepath.Join(opts.Dir, lockPrefix+name), os.O_RDWR|os.O_CREATE|syscall.O_CLOEXEC, 0o644)
	if err != nil {
		return nil, fmt.Errorf("kubebin: lock cache: %w", err)
	}
	// Closing the last descriptor drops the lock; Linux frees it even when
	// close reports an error, and the file is never written.
	release := func() { _ = f.Close() }
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err == nil {
		return release, nil
	} else if !errors.Is(err, syscall.EWOULDBLOCK) {
		release()
		return nil, fmt.Errorf("kubebin: lock cache: %w", err)
	}
	fmt.Fprintf(opts.Progress, "kubebin: waiting for another process's build of %s\n", name)
	// flock cannot be interrupted by a context: wait in a goroutine that
	// owns a descriptor of its own, and close it if ctx ends first.
	got := make(chan error, 1)
	go func() { got <- syscall.Flock(int(f.Fd()), syscall.LOCK_EX) }()
	select {
	case err := <-got:
		if err != nil {
			release()
			return nil, fmt.Errorf("kubebin: lock cache: %w", err)
		}
		return release, nil
	case <-ctx.Done():
		// The goroutine still blocks in flock on f: it takes the lock
		// once the other build ends and drops it when it is closed.
		go func() {
			if err := <-got; err != nil {
				fmt.Fprintf(opts.Progress, "kubebin: cache lock of %s, after giving up on it: %v\n", name, err)
			}
			release()
		}()
		return nil, fmt.Errorf("kubebin: waiting for the cache lock: %w", ctx.Err())
	}
}

// removeTemps removes what killed builds of name left in dir. The caller
// holds name's lock, so no other process builds it.
func removeTemps(dir, name string) {
	m, _ := filepath.Glob(filepath.Join(dir, tempPrefix+name+".*"))
	for _, p := range m {
		_ = os.Remove(p) // a file left is retried at the next build and never run
	}
}

func executable(path string) bool {
	fi, err := os.Stat(path)
	return err == nil && fi.Mode().IsRegular() && fi.Mode()&0o111 != 0
}

func goCmd(ctx context.Context, opts Options, args ...string) *exec.Cmd {
	cmd := exec.CommandContext(ctx, opts.Go, args...)
	cmd.Dir = opts.ModuleDir
	return cmd
}

// exitDetail adds a failed command's standard error to its error.
func exitDetail(err error) error {
	var ee *exec.ExitError
	if errors.As(err, &ee) && len(ee.Stderr) > 0 {
		return fmt.Errorf("%w: %s", err, bytes.TrimSpace(ee.Stderr))
	}
	return err
}

package image

import (
	"archive/tar"
	"bytes"
	"context"
	"debug/elf"
	"errors"
	"io"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"

	"github.com/xdpq/xdpq/internal/testing/testnet"
)

const (
	moduleDir    = "../../.."
	testVersion  = "v0.0.0-test"
	testRevision = "0123456789abcdef0123456789abcdef01234567"
)

// archive builds the image for goarch as `make image` does and writes it
// into a temporary directory. Its compile takes the time the test has
// (go test -timeout), not a fixed share of it: on an empty build cache a
// cross-compile takes minutes, on a warm one (make test builds both
// architectures' images first, `make image`) seconds.
func archive(t *testing.T, goarch string) string {
	t.Helper()
	ctx, cancel := buildContext(t)
	defer cancel()
	dir := t.TempDir()
	spec := Xdpq(testVersion, testRevision)
	files, err := Compile(ctx, "go", moduleDir, goarch, dir, spec)
	if err != nil {
		t.Fatal(err)
	}
	img, err := Build(spec, goarch, files, time.Unix(0, 0).UTC())
	if err != nil {
		t.Fatal(err)
	}
	tag, err := Tag(testVersion)
	if err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(dir, "xdpq-image-"+goarch+".tar")
	if err := WriteArchive(p, tag, img); err != nil {
		t.Fatal(err)
	}
	return p
}

// buildContext is a build's context: the test's, ending a little before
// go test's -timeout would panic, so that a build that overruns it fails
// with its own error (which binary, for which architecture).
func buildContext(t *testing.T) (context.Context, context.CancelFunc) {
	if d, ok := t.Deadline(); ok {
		return context.WithDeadline(t.Context(), d.Add(-15*time.Second))
	}
	return context.WithCancel(t.Context())
}

// TestDockerfileAndBuildAgree reads the Dockerfile as `docker build` would
// for each architecture, builds the image as `make image` does, and
// compares them: the final stage's files (and the go build lines that make
// them), entrypoint, user, working directory, environment and labels,
// against the docker-archive's config, tag and layers, whose binaries must
// be static executables of the architecture.
func TestDockerfileAndBuildAgree(t *testing.T) {
	machines := map[string]elf.Machine{"amd64": elf.EM_X86_64, "arm64": elf.EM_AARCH64}
	for _, arch := range []string{"amd64", "arm64"} {
		t.Run(arch, func(t *testing.T) {
			stages, err := parseDockerfile(filepath.Join(moduleDir, "Dockerfile"),
				map[string]string{"VERSION": testVersion, "REVISION": testRevision, "TARGETARCH": arch})
			if err != nil {
				t.Fatalf("Dockerfile: %v", err)
			}
			final := stages[len(stages)-1]
			want := dockerfileSpec(t, stages, arch)

			p := archive(t, arch)
			m, err := tarball.LoadManifest(func() (io.ReadCloser, error) { return os.Open(p) })
			if err != nil {
				t.Fatal(err)
			}
			if len(m) != 1 || !slices.Equal(m[0].RepoTags, []string{Repository + ":" + testVersion}) {
				t.Errorf("archive's manifest %+v, want one image tagged %s:%s", m, Repository, testVersion)
			}
			img, err := tarball.ImageFromPath(p, nil)
			if err != nil {
				t.Fatal(err)
			}
			cfg, err := img.ConfigFile()
			if err != nil {
				t.Fatal(err)
			}
			if cfg.OS != "linux" || cfg.Architecture != arch {
				t.Errorf("image is %s/%s, want linux/%s", cfg.OS, cfg.Architecture, arch)
			}
			got := imageConfig{cfg.Config.Entrypoint, cfg.Config.User, cfg.Config.WorkingDir, cfg.Config.Env, cfg.Config.Labels}
			if d := cmp.Diff(want.config, got); d != "" {
				t.Errorf("image config differs from the Dockerfile's (-Dockerfile +image):\n%s", d)
			}
			if cfg.Config.Cmd != nil || len(cfg.Config.ExposedPorts) > 0 || len(cfg.Config.Volumes) > 0 {
				t.Errorf("image config has what the Dockerfile does not say: %+v", cfg.Config)
			}
			layers, err := img.Layers()
			if err != nil {
				t.Fatal(err)
			}
			if len(layers) != len(final.copies) {
				t.Errorf("%d layers, want one per COPY of the Dockerfile's final stage: %d", len(layers), len(final.copies))
			}

			files := imageFiles(t, img)
			var paths []string
			for p := range files {
				paths = append(paths, p)
			}
			slices.Sort(paths)
			wantPaths := slices.Sorted(slices.Values(want.files))
			if !slices.Equal(paths, wantPaths) {
				t.Errorf("image files %q, Dockerfile copies %q", paths, wantPaths)
			}
			for p, f := range files {
				if f.hdr.Mode&0o111 != 0o111 || f.hdr.Uid != 0 || f.hdr.Gid != 0 {
					t.Errorf("%s: mode %o owner %d:%d, want executable by all, owned by root", p, f.hdr.Mode, f.hdr.Uid, f.hdr.Gid)
				}
				checkStatic(t, p, f.data, machines[arch])
			}
			for _, ep := range cfg.Config.Entrypoint[:1] {
				if _, ok := files[ep]; !ok {
					t.Errorf("entrypoint %s is not in the image", ep)
				}
			}
		})
	}
}

type imageConfig struct {
	Entrypoint []string
	User       string
	WorkingDir string
	Env        []string
	Labels     map[string]string
}

type dockerfileImage struct {
	config imageConfig
	files  []string
}

// dockerfileSpec is the image the Dockerfile's final stage describes,
// after checking that each file it copies from another stage is built
// there from the package Xdpq says, with the same go build flags and
// environment as Compile's.
func dockerfileSpec(t *testing.T, stages []*stage, arch string) dockerfileImage {
	t.Helper()
	final := stages[len(stages)-1]
	spec := Xdpq(testVersion, testRevision)
	byPath := map[string]Binary{}
	for _, b := range spec.Binaries {
		byPath[b.Path] = b
	}
	var out dockerfileImage
	for _, c := range final.copies {
		out.files = append(out.files, c.dest)
		if len(c.srcs) != 1 {
			t.Errorf("COPY %q %s: one file per COPY, as Build makes one layer per binary", c.srcs, c.dest)
			continue
		}
		src := c.srcs[0]
		b, ok := byPath[c.dest]
		if !ok {
			t.Errorf("Dockerfile copies %s, which Xdpq's spec does not hold", c.dest)
			continue
		}
		i := slices.IndexFunc(stages, func(s *stage) bool { return s.name == c.from && c.from != "" })
		if i < 0 {
			t.Errorf("COPY %s %s: from no stage of the Dockerfile", src, c.dest)
			continue
		}
		from := stages[i]
		want := append(append([]string{"go", "build"}, spec.GoFlags...), "-o", src, b.Package)
		if !slices.ContainsFunc(from.runs, func(r []string) bool { return slices.Equal(r, want) }) {
			t.Errorf("stage %s does not run %q, which Compile runs for %s", from.name, want, c.dest)
		}
		for _, e := range []string{"CGO_ENABLED=0", "GOOS=linux", "GOARCH=" + arch} {
			if !slices.Contains(from.env, e) {
				t.Errorf("stage %s does not set %s (its ENV: %q)", from.name, e, from.env)
			}
		}
	}
	for _, b := range spec.Binaries {
		if !slices.Contains(out.files, b.Path) {
			t.Errorf("Xdpq's spec holds %s, which the Dockerfile does not copy", b.Path)
		}
	}
	out.config = imageConfig{final.entry, final.user, final.wd, final.env, final.labels}
	return out
}

type imageFile struct {
	hdr  *tar.Header
	data []byte
}

// imageFiles returns the image's regular files by absolute path, and
// checks every other entry is a directory 0755 owned by root.
func imageFiles(t *testing.T, img v1.Image) map[string]imageFile {
	t.Helper()
	rc := mutate.Extract(img)
	defer rc.Close()
	tr := tar.NewReader(rc)
	files := map[string]imageFile{}
	for {
		hdr, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		p := path.Clean("/" + hdr.Name)
		switch hdr.Typeflag {
		case tar.TypeReg:
			data, err := io.ReadAll(tr)
			if err != nil {
				t.Fatal(err)
			}
			files[p] = imageFile{hdr, data}
		case tar.TypeDir:
			if hdr.Mode&0o7777 != 0o755 || hdr.Uid != 0 {
				t.Errorf("directory %s: mode %o owner %d, want 755 root", p, hdr.Mode, hdr.Uid)
			}
		default:
			t.Errorf("%s: tar entry type %q, want only files and directories", p, hdr.Typeflag)
		}
	}
	return files
}

// checkStatic checks data is an executable ELF of machine that needs no
// dynamic loader.
func checkStatic(t *testing.T, name string, data []byte, machine elf.Machine) {
	t.Helper()
	f, err := elf.NewFile(bytes.NewReader(data))
	if err != nil {
		t.Errorf("%s: not an ELF file: %v", name, err)
		return
	}
	defer f.Close()
	if f.Machine != machine || f.Type != elf.ET_EXEC {
		t.Errorf("%s: %v %v, want %v ET_EXEC", name, f.Machine, f.Type, machine)
	}
	for _, prog := range f.Progs {
		if prog.Type == elf.PT_INTERP || prog.Type == elf.PT_DYNAMIC {
			t.Errorf("%s: has %v: not static", name, prog.Type)
		}
	}
}

// TestBuildIsReproducible: the same binaries and time make the same image.
func TestBuildIsReproducible(t *testing.T) {
	dir := t.TempDir()
	spec := Xdpq("v1", "r1")
	files := map[string]string{}
	for i, b := range spec.Binaries {
		f := filepath.Join(dir, path.Base(b.Path))
		if err := os.WriteFile(f, []byte{byte(i), 0x7f, 'E', 'L', 'F'}, 0o755); err != nil {
			t.Fatal(err)
		}
		files[b.Path] = f
	}
	at := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	var ids []v1.Hash
	for range 2 {
		img, err := Build(spec, "arm64", files, at)
		if err != nil {
			t.Fatal(err)
		}
		id, err := img.Digest()
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, id)
	}
	if ids[0] != ids[1] {
		t.Errorf("two builds of the same inputs: %v and %v", ids[0], ids[1])
	}
}

func TestBuildRefuses(t *testing.T) {
	spec := Xdpq("v1", "r1")
	if _, err := Build(spec, "amd64", map[string]string{}, time.Time{}); err == nil || !strings.Contains(err.Error(), "no file for /usr/local/bin/xdpq-deviceplugin") {
		t.Errorf("Build without the binaries: %v", err)
	}
	spec.Binaries = []Binary{{"./cmd/xdpqctl", "usr/bin/x"}}
	f := filepath.Join(t.TempDir(), "x")
	if err := os.WriteFile(f, nil, 0o755); err != nil {
		t.Fatal(err)
	}
	if _, err := Build(spec, "amd64", map[string]string{"usr/bin/x": f}, time.Time{}); err == nil || !strings.Contains(err.Error(), `"usr/bin/x" is not a clean absolute path`) {
		t.Errorf("Build of a relative path: %v", err)
	}
	for _, v := range []string{"", "v1/2", "-x", strings.Repeat("a", 129)} {
		if _, err := Tag(v); err == nil {
			t.Errorf("Tag(%q) accepted", v)
		}
	}
}

// TestArchiveRunsInContainerd imports the host architecture's archive
// with ctr into a containerd of the test's own (its root, state and socket
// in a temporary directory; a namespace of the test), checks the image is
// complete and unpacked, runs its entrypoint with -h in a container (runc),
// and removes the image.
func TestArchiveRunsInContainerd(t *testing.T) {
	testnet.RequireRoot(t)
	for _, bin := range []string{"containerd", "ctr", "runc"} {
		testnet.RequireTool(t, "containerd runc", bin)
	}
	p := archive(t, runtime.GOARCH)
	sock := startContainerd(t)
	const ns = "xdpq-image-test"
	ctr := func(args ...string) string {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		out, err := exec.CommandContext(ctx, "ctr", append([]string{"--address", sock, "-n", ns}, args...)...).CombinedOutput()
		if err != nil {
			t.Fatalf("ctr %s: %v\n%s", strings.Join(args, " "), err, out)
		}
		return string(out)
	}
	// run is ctr run of a container that prints and exits at once:
	// containerd sometimes loses such a container's whole output
	// (containerd/containerd#5741, in Debian's 1.6 too), so an empty
	// output is asked once more; any other output stands.
	run := func(args ...string) string {
		t.Helper()
		out := ctr(append([]string{"run", "--rm"}, args...)...)
		if strings.TrimSpace(out) == "" {
			t.Logf("ctr run %s printed nothing; again (containerd#5741)", strings.Join(args, " "))
			out = ctr(append([]string{"run", "--rm"}, args...)...)
		}
		return out
	}
	ref := Repository + ":" + testVersion
	ctr("images", "import", p)
	if out := ctr("images", "check"); !strings.Contains(out, ref) || !strings.Contains(out, "complete") {
		t.Errorf("ctr images check:\n%s", out)
	}
	out := run(ref, "xdpq-image-test", "/usr/local/bin/xdpq-deviceplugin", "-h")
	if !strings.Contains(out, "-standalone") {
		t.Errorf("the daemon's -h in the image:\n%s", out)
	}
	out = run(ref, "xdpq-image-test", "/opt/xdpq/cni/xdpq")
	if !strings.Contains(out, "CNI") {
		t.Errorf("the CNI plugin without CNI_COMMAND in the image:\n%s", out)
	}
	// The chart's init container: the installer puts the CNI plugin into
	// a host directory mounted into the container (no shell, no cp).
	bin := t.TempDir()
	ctr("run", "--rm", "--mount", "type=bind,src="+bin+",dst=/host/cni/bin,options=rbind:rw", ref, "xdpq-image-test-install",
		"/usr/local/bin/xdpq-install-cni", "install", "-src", "/opt/xdpq/cni/xdpq", "-dir", "/host/cni/bin")
	if st, err := os.Stat(filepath.Join(bin, "xdpq")); err != nil || st.Mode() != 0o755 {
		t.Fatalf("the installed plugin: %v, %v; want mode 0755", st, err)
	}
	if out, _ := exec.Command(filepath.Join(bin, "xdpq")).CombinedOutput(); !strings.Contains(string(out), "CNI") {
		t.Errorf("the installed plugin without CNI_COMMAND:\n%s", out)
	}
	ctr("images", "rm", "--sync", ref)
	if out := ctr("images", "ls", "-q"); strings.Contains(out, ref) {
		t.Errorf("image still there after rm:\n%s", out)
	}
}

// startContainerd starts a containerd of the test's own and returns its
// socket once it has booted. It is stopped at the test's end.
func startContainerd(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	sock := filepath.Join(dir, "containerd.sock")
	config := `version = 2
root = "` + filepath.Join(dir, "root") + `"
state = "` + filepath.Join(dir, "state") + `"
disabled_plugins = ["io.containerd.grpc.v1.cri"]
[grpc]
  address = "` + sock + `"
[ttrpc]
  address = "` + sock + `.ttrpc"
`
	cfgPath := filepath.Join(dir, "config.toml")
	if err := os.WriteFile(cfgPath, []byte(config), 0o600); err != nil {
		t.Fatal(err)
	}
	log := &bootLog{booted: make(chan struct{})}
	cmd := exec.Command("containerd", "--config", cfgPath)
	cmd.Stdout, cmd.Stderr = log, log
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	t.Cleanup(func() {
		cmd.Process.Signal(os.Interrupt)
		<-exited
	})
	select {
	case <-log.booted:
	case err := <-exited:
		t.Fatalf("containerd exited before it booted: %v\n%s", err, log)
	case <-time.After(time.Minute):
		t.Fatalf("containerd did not boot within a minute:\n%s", log)
	}
	return sock
}

// bootLog is containerd's log; booted is closed when it says it booted.
type bootLog struct {
	mu     sync.Mutex
	buf    bytes.Buffer
	booted chan struct{}
	done   bool
}

func (l *bootLog) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.buf.Write(p)
	if !l.done && bytes.Contains(l.buf.Bytes(), []byte("containerd successfully booted")) {
		l.done = true
		close(l.booted)
	}
	return len(p), nil
}

func (l *bootLog) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.String()
}

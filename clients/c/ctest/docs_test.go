package ctest_test

import (
	"bufio"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/xdpq/xdpq/internal/frame"
	"github.com/xdpq/xdpq/internal/testing/testnet"
	"github.com/xdpq/xdpq/pkg/broker"
)

// repoRoot is the repository's root, from this package's directory.
const repoRoot = "../../.."

// fencedBlock is the first fenced block of language lang after the line
// heading of the markdown file doc (relative to the repository's root).
func fencedBlock(t *testing.T, doc, heading, lang string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(repoRoot, doc))
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	seen, in := false, false
	sc := bufio.NewScanner(strings.NewReader(string(b)))
	for sc.Scan() {
		line := sc.Text()
		switch {
		case !seen:
			seen = line == heading
		case !in:
			in = line == "```"+lang
		case line == "```":
			return strings.Join(out, "\n") + "\n"
		default:
			out = append(out, line)
		}
	}
	t.Fatalf("%s: no ```%s block after %q", doc, lang, heading)
	return ""
}

// shownCommand is the one command of doc's ```sh blocks that starts with
// prefix, without its comment.
func shownCommand(t *testing.T, doc, prefix string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(repoRoot, doc))
	if err != nil {
		t.Fatal(err)
	}
	var found []string
	in := false
	sc := bufio.NewScanner(strings.NewReader(string(b)))
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if strings.HasPrefix(line, "```") {
			in = !in && line == "```sh"
			continue
		}
		if in && strings.HasPrefix(line, prefix) {
			cmd, _, _ := strings.Cut(line, "#")
			found = append(found, strings.TrimSpace(cmd))
		}
	}
	if len(found) != 1 {
		t.Fatalf("%s: %d commands starting with %q in ```sh blocks (%q), want 1", doc, len(found), prefix, found)
	}
	return found[0]
}

// argAfter is the argument after flag in args.
func argAfter(t *testing.T, args []string, flag string) string {
	t.Helper()
	i := slices.Index(args, flag)
	if i < 0 || i+1 == len(args) {
		t.Fatalf("%q has no %s argument", args, flag)
	}
	return args[i+1]
}

// TestMyAppOfTheDocs: the C program of docs/protocol.md's "Using it from
// C" builds with the command line that docs/clients.md and
// docs/protocol.md each show, run as shown (cc, paths relative to the
// repository's root) in a directory laid out as the repository: the
// headers in clients/c, libxdpq.a where the make command that doc shows
// puts it. Without a warning. Then each build runs as a pod, uid 65534 with no capability,
// against a real broker: it receives every frame sent to its
// allocation's first queue, says what each was, and ends the lease.
func TestMyAppOfTheDocs(t *testing.T) {
	src := fencedBlock(t, "docs/protocol.md", "## Using it from C", "c")
	headers, err := filepath.Glob("../*.h")
	if err != nil || len(headers) == 0 {
		t.Fatalf("the C client's headers: %v %v", headers, err)
	}
	for _, c := range []struct {
		doc string
		lib string // where the make command above it puts the library
	}{
		{"docs/clients.md", "bin/c"},      // make cclient: O=$(CURDIR)/bin/c
		{"docs/protocol.md", "clients/c"}, // make -C clients/c: O=.
	} {
		doc := c.doc
		t.Run(doc, func(t *testing.T) {
			testnet.RequireTool(t, "gcc", "cc")
			args := strings.Fields(shownCommand(t, doc, "cc "))
			work := t.TempDir()
			inc := filepath.Join(work, "clients", "c")
			if err := os.MkdirAll(inc, 0o755); err != nil {
				t.Fatal(err)
			}
			for _, h := range headers {
				abs, err := filepath.Abs(h)
				if err != nil {
					t.Fatal(err)
				}
				if err := os.Symlink(abs, filepath.Join(inc, filepath.Base(h))); err != nil {
					t.Fatal(err)
				}
			}
			buildIn(t, filepath.Join(work, c.lib), "libxdpq.a")
			if err := os.WriteFile(filepath.Join(work, "my-app.c"), []byte(src), 0o644); err != nil {
				t.Fatal(err)
			}
			cmd := exec.Command(args[0], args[1:]...)
			cmd.Dir = work
			out, err := cmd.CombinedOutput()
			if err != nil || len(out) != 0 {
				t.Fatalf("%s (in a copy of the repository's layout): %v\n%s", strings.Join(args, " "), err, out)
			}
			runMyApp(t, filepath.Join(work, argAfter(t, args, "-o")))
		})
	}
}

// runMyApp runs the program of docs/protocol.md as a pod on a node whose
// allocation is queues 0 and 1, sends it frames of 100 sizes on queue 0,
// and checks what it printed of each and that its lease ended.
func runMyApp(t *testing.T, bin string) {
	t.Helper()
	leases := make(chan []broker.LeaseSocket, 8)
	n, p := startNode(t, nobody, func(_ string, s []broker.LeaseSocket) { leases <- s }, 0)
	const count = 100
	r := startRxdrop(t, bin, n.Alloc.SocketPath(), strconv.Itoa(count))
	deadline := time.NewTimer(20 * time.Second)
	defer deadline.Stop()
	select {
	case s := <-leases:
		if len(s) != 2 {
			t.Fatalf("its lease has %d sockets, want the allocation's 2", len(s))
		}
	case <-r.done:
		t.Fatalf("waiting for its lease: the program exited (%v)\nstderr:\n%s", r.err, strings.Join(r.stderr.snapshot(), "\n"))
	case <-deadline.C:
		t.Fatal("waiting for its lease: not within 20s")
	}
	var sent [][]byte
	var want []string
	for i := range count {
		f, err := frame.Spec{SrcMAC: n.Pair.B.MAC, DstMAC: n.Pair.A.MAC, Src: n.Pair.B.Addr, Dst: n.Pair.A.Addr, Protocol: 17,
			SrcPort: 9, DstPort: 7000, Payload: frame.Payload(0, uint64(i), 18+13*i)}.Build()
		if err != nil {
			t.Fatal(err)
		}
		sent = append(sent, f)
		want = append(want, fmt.Sprintf("queue 0: %d bytes, ethertype 0800", len(f)))
	}
	if err := p.Send[0].Send(sent, time.Now().Add(5*time.Second)); err != nil {
		t.Fatal(err)
	}
	select {
	case <-r.done:
	case <-deadline.C:
		t.Fatalf("the program did not exit within 20s of being sent %d frames\nstdout:\n%s\nstderr:\n%s", count,
			strings.Join(r.stdout.snapshot(), "\n"), strings.Join(r.stderr.snapshot(), "\n"))
	}
	if r.err != nil || len(r.stderr.snapshot()) != 0 {
		t.Errorf("the program: %v\nstderr:\n%s", r.err, strings.Join(r.stderr.snapshot(), "\n"))
	}
	if got := r.stdout.snapshot(); !slices.Equal(got, want) {
		t.Errorf("it printed\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	select {
	case s := <-leases:
		if s != nil {
			t.Errorf("a second lease %v, want the first's end", s)
		}
	case <-deadline.C:
		t.Error("the lease did not end within 20s of the program's start")
	}
}

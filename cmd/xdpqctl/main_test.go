package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/xdpq/xdpq"
	"github.com/xdpq/xdpq/pkg/api"
)

// backend is a fake of a standalone daemon's API with one pool of 4 queues; it
// records what it is asked.
type backend struct {
	mu    sync.Mutex
	asked []string
}

func (b *backend) ask(format string, a ...any) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.asked = append(b.asked, fmt.Sprintf(format, a...))
}

func (b *backend) Status(context.Context) (*api.Status, error) {
	b.ask("status")
	return &api.Status{Pools: []api.PoolStatus{{Name: "upf", Queues: 4, Free: 3, Allocations: 1}}, Allocations: 1}, nil
}

func (b *backend) Allocations(_ context.Context, pool string) (*api.AllocationList, error) {
	b.ask("allocations %s", pool)
	if pool != "" && pool != "upf" {
		return nil, api.Errorf(api.ErrNotFound, "no pool %q (pools: upf)", pool)
	}
	return &api.AllocationList{Allocations: []api.Allocation{{ID: "upf-1", Pool: "upf", Netdev: "eth1", Queues: []uint32{0}}}}, nil
}

func (b *backend) Alloc(_ context.Context, req api.AllocRequest) (*api.Allocation, error) {
	b.ask("alloc %s %d %d", req.Pool, req.Count, req.UID)
	if req.Pool != "upf" {
		return nil, api.Errorf(api.ErrNotFound, "no pool %q (pools: upf)", req.Pool)
	}
	return &api.Allocation{ID: "upf-1", Pool: "upf", Netdev: "eth1", Queues: []uint32{0, 1}[:req.Count]}, nil
}

func (b *backend) Free(_ context.Context, id string) error {
	b.ask("free %s", id)
	if id != "upf-1" {
		return api.Errorf(api.ErrNotFound, "no allocation %q", id)
	}
	return nil
}

func (b *backend) CNIAdd(context.Context, api.CNIAddRequest) (*api.Attachment, error) {
	return nil, api.ErrNotSupported
}
func (b *backend) CNIDel(context.Context, api.AttachmentRef) error { return api.ErrNotSupported }
func (b *backend) CNICheck(context.Context, api.AttachmentRef) (*api.Attachment, error) {
	return nil, api.ErrNotSupported
}
func (b *backend) CNIGC(context.Context, api.GCRequest) ([]string, error) {
	return nil, api.ErrNotSupported
}

func fakeDaemon(t *testing.T) (socket string, b *backend) {
	t.Helper()
	socket = filepath.Join(t.TempDir(), "api.sock")
	ln, err := api.Listen(socket)
	if err != nil {
		t.Fatal(err)
	}
	b = &backend{}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- api.Serve(ctx, ln, api.NewHandler(b, nil), nil) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Error(err)
		}
	})
	return socket, b
}

func TestCommandLine(t *testing.T) {
	socket, b := fakeDaemon(t)
	for _, tt := range []struct {
		args   string
		code   int
		stdout string // a part of it
		stderr string // a part of it
		asked  string // what the daemon was asked, "; " between calls, "" for nothing
	}{
		{"", 2, "", "usage: xdpqctl [-api-socket PATH] [-o table|json] COMMAND", ""},
		{"-h", 0, "usage: xdpqctl [-api-socket PATH] [-o table|json] COMMAND", "", ""},
		{"--help", 0, "usage: xdpqctl", "", ""},
		{"help", 0, "usage: xdpqctl", "", ""},
		{"-bogus status", 2, "", "xdpqctl: flag provided but not defined: -bogus\nusage: xdpqctl", ""},
		{"nope", 2, "", `xdpqctl: unknown command "nope"`, ""},
		{"free -h", 0, "usage: xdpqctl [-api-socket PATH] [-o table|json] free ID\n", "", ""},
		{"free --help", 0, "usage: xdpqctl [-api-socket PATH] [-o table|json] free ID\n", "", ""},
		{"free upf-1 -h", 0, "usage: xdpqctl [-api-socket PATH] [-o table|json] free ID\n", "", ""},
		{"free", 2, "", "xdpqctl free: the allocation id is missing\nusage: xdpqctl [-api-socket PATH] [-o table|json] free ID", ""},
		{"free a b", 2, "", `xdpqctl free: takes one allocation id, got 2 arguments ["a" "b"]`, ""},
		{"free -x upf-1", 2, "", "xdpqctl free: flag provided but not defined: -x", ""},
		{"free upf-1", 0, "freed upf-1\n", "", "free upf-1"},
		{"-o json free upf-1", 0, `"freed": "upf-1"`, "", "free upf-1"},
		{"free upf-1 -o json", 0, `"freed": "upf-1"`, "", "free upf-1"},
		{"free -api-socket $SOCK upf-1", 0, "freed upf-1\n", "", "free upf-1"},
		{"free upf-1 -api-socket $SOCK -o json", 0, `"freed": "upf-1"`, "", "free upf-1"},
		{"-api-socket /nonexistent/api.sock free upf-1 -api-socket $SOCK", 0, "freed upf-1\n", "", "free upf-1"},
		{"free -- -h", 1, "", `xdpqctl free: no allocation "-h"`, "free -h"},
		{"free upf-2", 1, "", "xdpqctl free: no allocation \"upf-2\"\n", "free upf-2"},
		{"free upf-1 -o yaml", 2, "", "xdpqctl free: -o yaml: want table or json\nusage:", ""},
		{"-o yaml status", 2, "", "xdpqctl status: -o yaml: want table or json\nusage:", ""},
		{"alloc -h", 0, "usage: xdpqctl [-api-socket PATH] [-o table|json] alloc -pool POOL [-n N] [-uid UID]\n", "", ""},
		{"alloc -h", 0, "flags of every command:\n  -api-socket PATH", "", ""},
		{"alloc", 2, "", "xdpqctl alloc: -pool is required", ""},
		{"alloc -pool", 2, "", "xdpqctl alloc: flag needs an argument: -pool", ""},
		{"alloc -pool upf extra", 2, "", `xdpqctl alloc: takes no arguments, got ["extra"]`, ""},
		{"alloc -pool upf -n 0", 2, "", "xdpqctl alloc: -n 0: at least 1 queue", ""},
		{"alloc -pool upf -n -1", 2, "", "xdpqctl alloc: -n -1: at least 1 queue", ""},
		{"alloc -pool upf -n x", 2, "", `xdpqctl alloc: invalid value "x" for flag -n`, ""},
		{"alloc -pool upf -uid 4294967296", 2, "", "xdpqctl alloc: -uid 4294967296: not a uid", ""},
		{"alloc -pool upf -n 2 -uid 1000", 0, "ID     POOL  NETDEV  QUEUES  UID  SOCKET\nupf-1  upf   eth1    0-1     -    \n", "", "alloc upf 2 1000"},
		{"alloc -pool upf -n 2 -uid 1000 -o json", 0, `"id": "upf-1"`, "", "alloc upf 2 1000"},
		{"-o json alloc -n 2 -pool upf -uid 1000", 0, `"queues": [`, "", "alloc upf 2 1000"},
		{"alloc -pool nope", 1, "", "xdpqctl alloc: no pool \"nope\" (pools: upf)\n", fmt.Sprintf("alloc nope 1 %d", os.Getuid())},
		{"status -h", 0, "usage: xdpqctl [-api-socket PATH] [-o table|json] status\n", "", ""},
		{"status now", 2, "", `xdpqctl status: takes no arguments, got ["now"]`, ""},
		{"status -o json now", 2, "", `xdpqctl status: takes no arguments, got ["now"]`, ""},
		{"status", 0, "POOL  RESOURCE  QUEUES  FREE  ALLOCATIONS  REASON\nupf             4       3     1            -\n\nALLOCATION  POOL  NETDEV  QUEUES  UID  POD  LEASE  HOLDER  AGE\nupf-1       upf   eth1    0       -    -    -      -       -\n\nno CNI attachments\n\nno netdevs\n", "", "status; allocations "},
		{"status -o json", 0, "{\n  \"pools\": [\n    {\n      \"name\": \"upf\",\n      \"resource\": \"\",\n      \"queues\": 4,\n      \"free\": 3,\n      \"allocations\": 1\n    }\n  ],\n  \"allocations\": 1,\n  \"attachments\": 0,\n  \"netdevs\": null\n}\n", "", "status"},
		{"-o json status", 0, `"allocations": 1,`, "", "status"},
		{"status -o table", 0, "no CNI attachments", "", "status; allocations "},
		{"allocations -h", 0, "usage: xdpqctl [-api-socket PATH] [-o table|json] allocations [-pool POOL]\n", "", ""},
		{"allocations upf", 2, "", `xdpqctl allocations: takes no arguments, got ["upf"]`, ""},
		{"allocations -pool", 2, "", "xdpqctl allocations: flag needs an argument: -pool", ""},
		{"allocations", 0, "ALLOCATION  POOL  NETDEV  QUEUES  UID  POD  LEASE  HOLDER  AGE\nupf-1       upf   eth1    0       -    -    -      -       -\n\nno CNI attachments\n", "", "allocations "},
		{"allocations -pool upf", 0, "upf-1       upf   eth1", "", "allocations upf"},
		{"allocations -pool upf -o json", 0, "{\n  \"allocations\": [\n    {\n      \"id\": \"upf-1\",", "", "allocations upf"},
		{"-o json allocations", 0, "\"attachments\": []\n}\n", "", "allocations "},
		{"allocations -pool nope", 1, "", "xdpqctl allocations: no pool \"nope\" (pools: upf)\n", "allocations nope"},
	} {
		t.Run(tt.args, func(t *testing.T) {
			b.mu.Lock()
			b.asked = nil
			b.mu.Unlock()
			var stdout, stderr bytes.Buffer
			args := strings.Fields(strings.ReplaceAll(tt.args, "$SOCK", socket))
			if !strings.Contains(tt.args, "$SOCK") {
				args = append([]string{"-api-socket", socket}, args...)
			}
			code := run(args, &stdout, &stderr)
			if code != tt.code || !strings.Contains(stdout.String(), tt.stdout) || !strings.Contains(stderr.String(), tt.stderr) {
				t.Errorf("exit %d, want %d\nstdout %q, want %q in it\nstderr %q, want %q in it", code, tt.code, stdout.String(), tt.stdout, stderr.String(), tt.stderr)
			}
			if code == 0 && strings.Contains(tt.args, "-o json") && !json.Valid(stdout.Bytes()) {
				t.Errorf("not JSON: %s", stdout.String())
			}
			b.mu.Lock()
			asked := strings.Join(b.asked, "; ")
			b.mu.Unlock()
			if asked != tt.asked {
				t.Errorf("daemon asked %q, want %q", asked, tt.asked)
			}
		})
	}
}

// TestVersion: xdpqctl version prints its release and the daemon's
// (release and API version), as a table or JSON; a daemon that does not
// answer is said so after xdpqctl's own release, and the command fails.
func TestVersion(t *testing.T) {
	socket, _ := fakeDaemon(t)
	v := xdpq.Version()
	for _, tt := range []struct {
		args           []string
		code           int
		stdout, stderr string
	}{
		{[]string{"-api-socket", socket, "version"}, 0, "xdpqctl:  " + v + "\ndaemon:   " + v + " (API 2)\n", ""},
		{[]string{"-api-socket", socket, "-o", "json", "version"}, 0,
			"{\n  \"client\": \"" + v + "\",\n  \"daemon\": {\n    \"api\": 2,\n    \"release\": \"" + v + "\"\n  }\n}\n", ""},
		{[]string{"-api-socket", filepath.Join(t.TempDir(), "none.sock"), "version"}, 1, "xdpqctl:  " + v + "\n", "xdpqctl version: the xdpq daemon's API at"},
		{[]string{"-api-socket", socket, "version", "now"}, 2, "", `xdpqctl version: takes no arguments, got ["now"]`},
	} {
		var stdout, stderr bytes.Buffer
		code := run(tt.args, &stdout, &stderr)
		if code != tt.code || stdout.String() != tt.stdout || !strings.Contains(stderr.String(), tt.stderr) {
			t.Errorf("xdpqctl %q: exit %d, stdout %q, stderr %q; want %d, %q, %q", tt.args, code, stdout.String(), stderr.String(), tt.code, tt.stdout, tt.stderr)
		}
	}
}

package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/containernetworking/plugins/pkg/testutils"

	"github.com/xdpq/xdpq/internal/testing/testnet"
	"github.com/xdpq/xdpq/pkg/api"
	"github.com/xdpq/xdpq/pkg/client"
	"github.com/xdpq/xdpq/pkg/daemon"
	"github.com/xdpq/xdpq/pkg/xdp"
)

// TestStatusOfARealDaemon runs a standalone daemon on a veth pair; the
// test allocates a queue with xdpqctl, takes its socket with pkg/client
// (a lease) and attaches it with a CNI ADD into a network namespace of
// its own. xdpqctl status (a table) and xdpqctl allocations (a table and
// JSON) show who holds the allocation (uid, pod), the leased queue and the
// attachment (container, interface, netns, flows); status -o json counts
// them; xdpqctl free then ends both.
func TestStatusOfARealDaemon(t *testing.T) {
	p := testnet.NewPair(t, 2)
	if err := xdp.MountBPFFS(xdp.DefaultBPFFS); err != nil {
		t.Fatal(err)
	}
	pins, err := os.MkdirTemp(xdp.DefaultBPFFS, "xdpq-test-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(pins) })
	dir := t.TempDir()
	cfg := filepath.Join(dir, "config.yaml")
	if err := os.WriteFile(cfg, []byte("pools: [{name: upf, steering: software, devices: {netdevs: ['xa#0-1']}}]\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	socket := filepath.Join(dir, "api.sock")
	d, err := daemon.New(daemon.Options{ConfigPath: cfg, NetNS: p.NSPath(), PinDir: filepath.Join(pins, "xdpq"),
		StateDir: filepath.Join(dir, "state"), AllocDir: filepath.Join(dir, "alloc"), Standalone: true, APISocket: socket,
		Logger: slog.New(slog.NewTextHandler(t.Output(), nil))})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- d.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Error(err)
		}
	})
	select {
	case <-d.Ready():
	case err := <-done:
		t.Fatalf("the daemon stopped: %v", err)
	}

	ctl := func(args string) string {
		t.Helper()
		var stdout, stderr bytes.Buffer
		if code := run(append([]string{"-api-socket", socket}, strings.Fields(args)...), &stdout, &stderr); code != 0 {
			t.Fatalf("xdpqctl %s: exit %d\n%s", args, code, stderr.String())
		}
		return stdout.String()
	}
	var a api.Allocation
	if err := json.Unmarshal([]byte(ctl(fmt.Sprintf("alloc -pool upf -n 1 -uid %d -o json", os.Getuid()))), &a); err != nil {
		t.Fatal(err)
	}
	lease, err := client.Connect(a.Socket, client.Options{Name: "xdpqctl-test"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { lease.Close() })

	pod, err := testutils.NewNS()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pod.Close(); testutils.UnmountNS(pod) })
	container := "0123456789abcdef0123456789abcdef"
	flow := api.CNIFlow{Protocol: "udp", Dst: netip.MustParsePrefix("10.1.0.2/32"), DstPort: 2152}
	if _, err := api.NewClient(socket).CNIAdd(api.CNIAddRequest{ContainerID: container, IfName: "net1", Allocation: a.ID,
		PodNamespace: "ran", PodName: "upf-0", Netns: pod.Path(), Flows: []api.CNIFlow{flow}, Addresses: []netip.Addr{flow.Dst.Addr()}}); err != nil {
		t.Fatal(err)
	}

	table := ctl("status")
	q := fmt.Sprint(a.Queues[0])
	for _, want := range []string{
		"POOL  RESOURCE     QUEUES  FREE  ALLOCATIONS  REASON\nupf   xdpq.io/upf  2       1     1            -\n",
		fmt.Sprintf("%s  upf   xa      %s       %d    ran/upf-0  %s      ", a.ID, q, os.Getuid(), q),
		fmt.Sprintf("0123456789ab  net1       %s  %s  ran/upf-0  active  udp 10.1.0.2/32:2152\n", pod.Path(), a.ID),
		"\nxa      Filter  native  software  1      " + q + "        up    -\n",
	} {
		if !strings.Contains(table, want) {
			t.Errorf("xdpqctl status has no %q:\n%s", want, table)
		}
	}

	list := ctl("allocations")
	for _, want := range []string{
		fmt.Sprintf("%s  upf   xa      %s       %d    ran/upf-0  %s      ", a.ID, q, os.Getuid(), q),
		fmt.Sprintf("0123456789ab  net1       %s  %s  ran/upf-0  active  udp 10.1.0.2/32:2152\n", pod.Path(), a.ID),
	} {
		if !strings.Contains(list, want) {
			t.Errorf("xdpqctl allocations has no %q:\n%s", want, list)
		}
	}
	if !strings.Contains(table, list) {
		t.Errorf("xdpqctl status does not show what xdpqctl allocations does:\n%s\n%s", table, list)
	}
	if out := ctl("allocations -pool upf"); out != list {
		t.Errorf("xdpqctl allocations -pool upf:\n%s\nwant\n%s", out, list)
	}

	var st api.Status
	if err := json.Unmarshal([]byte(ctl("status -o json")), &st); err != nil {
		t.Fatal(err)
	}
	if st.Allocations != 1 || st.Attachments != 1 || len(st.Pools) != 1 || st.Pools[0].Allocations != 1 || len(st.Netdevs) != 1 {
		t.Errorf("status %+v: want 1 allocation, 1 attachment, pool upf of 1 allocation, netdev xa", st)
	}
	var s api.AllocationList
	if err := json.Unmarshal([]byte(ctl("allocations -o json")), &s); err != nil {
		t.Fatal(err)
	}
	if len(s.Allocations) != 1 || s.Allocations[0].Pod != "ran/upf-0" || !slices.Equal(s.Allocations[0].Lease, a.Queues) ||
		s.Allocations[0].UID == nil || *s.Allocations[0].UID != uint32(os.Getuid()) ||
		s.Allocations[0].Holder == nil || s.Allocations[0].Holder.PID != int32(os.Getpid()) || s.Allocations[0].Holder.UID != uint32(os.Getuid()) {
		t.Errorf("allocations %+v: want %s held by uid %d, pod ran/upf-0, queues %v leased by this process", s.Allocations, a.ID, os.Getuid(), a.Queues)
	}
	if len(s.Attachments) != 1 || s.Attachments[0].ContainerID != container || s.Attachments[0].IfName != "net1" ||
		s.Attachments[0].Netns != pod.Path() || s.Attachments[0].State != "active" || !slices.Equal(s.Attachments[0].Flows, []api.CNIFlow{flow}) {
		t.Errorf("attachments %+v", s.Attachments)
	}

	if out := ctl("free " + a.ID); out != "freed "+a.ID+"\n" {
		t.Errorf("xdpqctl free: %q", out)
	}
	if out := ctl("status"); !strings.Contains(out, "upf   xdpq.io/upf  2       2     0            -\n\nno allocations\n\nno CNI attachments\n") {
		t.Errorf("status after free:\n%s", out)
	}
	if out := ctl("allocations -o json"); out != "{\n  \"allocations\": [],\n  \"attachments\": []\n}\n" {
		t.Errorf("allocations after free: %s", out)
	}
}

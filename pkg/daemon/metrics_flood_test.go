package daemon

import (
	"bufio"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/xdpq/xdpq/internal/testing/testbin"
	"github.com/xdpq/xdpq/internal/testing/testnet"
	"github.com/xdpq/xdpq/pkg/api"
)

// TestMetricsFlood: the metrics port is on the host's network, where every
// pod can reach it. The daemon runs as its own process with nofile 8192
// (prlimit; above the 5,124 it asks for on this config, so that it starts
// without a state error), and 10,000 connections each ask /healthz once
// with keep-alive and then stay open, idle. The daemon keeps at most metricsMaxConns of
// them (the rest wait in the kernel's backlog), so its API answers, an
// allocation works and its descriptors stay far from the limit; once the
// flood's connections are gone, /metrics answers again. (Before, every
// connection was kept open forever: the daemon ran out of descriptors
// and its API, its broker and its config watcher with it.)
func TestMetricsFlood(t *testing.T) {
	testnet.RequireRoot(t)
	prlimit := testnet.RequireTool(t, "util-linux", "prlimit")
	bin := t.TempDir()
	testbin.Build(t, filepath.Join(bin, "deviceplugin"), "github.com/xdpq/xdpq/cmd/deviceplugin")
	p := testnet.NewPair(t, 2)
	o := standaloneOpts(t, p, t.TempDir(), testPins(t), "pools: [{name: q, steering: software, devices: {netdevs: ['xa#0-1']}}]\n")
	// A free port for the metrics address: the daemon's flag takes an
	// address, not a listener.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()

	const nofile = 8192
	d, err := startDaemonProcess(filepath.Join(bin, "deviceplugin"), o,
		[]string{prlimit, fmt.Sprintf("--nofile=%d:%d", nofile, nofile), "--"}, "--metrics-addr", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		d.stop()
		if t.Failed() {
			t.Logf("daemon's log:\n%s", d.out)
		}
	})
	c := api.NewClient(o.APISocket)
	// The process prlimit started is the daemon (prlimit execs it).
	fds := func() int {
		ents, err := os.ReadDir(fmt.Sprintf("/proc/%d/fd", d.pid))
		if err != nil {
			t.Fatal(err)
		}
		return len(ents)
	}
	before := fds()

	// The flood: 10,000 connections, 200 dialling at once; each asks
	// /healthz with keep-alive, reads the answer if one comes within 200
	// ms (past the limit none does: the connection waits in the
	// backlog) and stays open.
	const flood = 10000
	var (
		mu       sync.Mutex
		conns    []net.Conn
		answered int
		wg       sync.WaitGroup
	)
	work := make(chan struct{})
	for range 200 {
		wg.Go(func() {
			for range work {
				conn, err := net.DialTimeout("tcp", addr, 500*time.Millisecond)
				if err != nil {
					continue // the backlog is full: the kernel drops the SYN
				}
				fmt.Fprintf(conn, "GET /healthz HTTP/1.1\r\nHost: %s\r\n\r\n", addr)
				conn.SetReadDeadline(time.Now().Add(200 * time.Millisecond))
				resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
				mu.Lock()
				conns = append(conns, conn)
				if err == nil {
					resp.Body.Close()
					answered++
				}
				mu.Unlock()
			}
		})
	}
	for range flood {
		work <- struct{}{}
	}
	close(work)
	wg.Wait()
	defer func() {
		for _, conn := range conns {
			conn.Close()
		}
	}()
	t.Logf("%d connections open, %d of them answered; the daemon's descriptors: %d before, %d now (nofile %d)",
		len(conns), answered, before, fds(), nofile)

	// The daemon's own work goes on.
	if n := fds(); n > before+metricsMaxConns+32 {
		t.Errorf("the daemon holds %d descriptors under the flood (%d before, at most %d connections): the flood takes them",
			n, before, metricsMaxConns)
	}
	if _, err := c.Status(); err != nil {
		t.Fatalf("the API under the flood: %v", err)
	}
	a, err := c.Alloc("q", 1, 65534)
	if err != nil {
		t.Fatalf("an allocation under the flood: %v", err)
	}
	if err := c.Free(a.ID); err != nil {
		t.Fatalf("free under the flood: %v", err)
	}
	if strings.Contains(d.out.String(), "too many open files") {
		t.Errorf("the daemon ran out of descriptors:\n%s", d.out)
	}

	// The flood goes: a scrape is answered.
	for _, conn := range conns {
		conn.Close()
	}
	conns = nil
	hc := &http.Client{Timeout: 5 * time.Second}
	deadline := time.Now().Add(30 * time.Second)
	for {
		resp, err := hc.Get("http://" + addr + "/metrics")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				break
			}
			err = fmt.Errorf("%s", resp.Status)
		}
		if time.Now().After(deadline) {
			t.Fatalf("/metrics after the flood: %v", err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

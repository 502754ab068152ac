package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/xdpq/xdpq/internal/testing/testbin"
)

// BenchmarkExecCPU: the CPU (user and system) one exec of the plugin
// costs, answering VERSION, side by side with a Go hello world and with
// the least a plugin on containernetworking/cni links (skel and invoke):
// a runtime execs the plugin for every ADD, DEL, CHECK and GC of every
// pod. Reported as ms/exec of each and their ratios to hello world.
func BenchmarkExecCPU(b *testing.B) {
	dir := b.TempDir()
	bins := []struct{ name, pkg string }{
		{"hello", "./testdata/hello"},
		{"cnifloor", "./testdata/cnifloor"},
		{"xdpq", "."},
	}
	for _, bin := range bins {
		testbin.Build(b, filepath.Join(dir, bin.name), bin.pkg)
	}
	cpu := make([]time.Duration, len(bins))
	b.ResetTimer()
	for b.Loop() {
		for i, bin := range bins { // interleaved: the same machine load for each
			cmd := exec.Command(filepath.Join(dir, bin.name))
			cmd.Env = append(os.Environ(), "CNI_COMMAND=VERSION")
			if err := cmd.Run(); err != nil {
				b.Fatalf("%s: %v", bin.name, err)
			}
			cpu[i] += cmd.ProcessState.UserTime() + cmd.ProcessState.SystemTime()
		}
	}
	per := func(i int) float64 { return float64(cpu[i].Microseconds()) / 1000 / float64(b.N) }
	for i, bin := range bins {
		b.ReportMetric(per(i), bin.name+"-ms/exec")
		if i > 0 {
			b.ReportMetric(per(i)/per(0), bin.name+"/hello")
		}
	}
}

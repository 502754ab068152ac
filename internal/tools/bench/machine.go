package bench

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"strings"

	"golang.org/x/sys/unix"
)

// Machine is what makes two tables comparable: the CPU, the kernel, the
// cores and how busy the machine was when the run began.
type Machine struct {
	CPU     string // model name
	MHz     string // the first core's clock as /proc/cpuinfo says
	Cores   int    // processors online
	Kernel  string // release
	LoadAvg string // 1, 5 and 15 minutes, at the start
}

// ReadMachine reads the machine from /proc and uname.
func ReadMachine() (Machine, error) {
	var m Machine
	f, err := os.Open("/proc/cpuinfo")
	if err != nil {
		return m, err
	}
	defer func() { _ = f.Close() }() // read only
	m = parseCPUInfo(f)
	var u unix.Utsname
	if err := unix.Uname(&u); err != nil {
		return m, fmt.Errorf("uname: %w", err)
	}
	m.Kernel = unix.ByteSliceToString(u.Release[:])
	la, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return m, err
	}
	if f := strings.Fields(string(la)); len(f) >= 3 {
		m.LoadAvg = strings.Join(f[:3], " ")
	}
	return m, nil
}

// parseCPUInfo reads the model, the first clock and the processor count.
func parseCPUInfo(r io.Reader) Machine {
	var m Machine
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		k, v, ok := strings.Cut(sc.Text(), ":")
		if !ok {
			continue
		}
		k, v = strings.TrimSpace(k), strings.TrimSpace(v)
		switch k {
		case "processor":
			m.Cores++
		case "model name":
			if m.CPU == "" {
				m.CPU = v
			}
		case "cpu MHz":
			if m.MHz == "" {
				m.MHz = v
			}
		}
	}
	return m
}

// String is the table's machine line.
func (m Machine) String() string {
	mhz := ""
	if m.MHz != "" {
		mhz = " at " + m.MHz + " MHz"
	}
	return fmt.Sprintf("machine: %s%s, %d cores, kernel %s, load average %s at the start", m.CPU, mhz, m.Cores, m.Kernel, m.LoadAvg)
}

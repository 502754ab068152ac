package bench

import (
	"strings"
	"testing"
)

func TestParseCPUInfo(t *testing.T) {
	const info = `processor	: 0
vendor_id	: AuthenticAMD
model name	: AMD EPYC 9654 96-Core Processor
cpu MHz		: 2396.400
flags		: fpu vme

processor	: 1
model name	: AMD EPYC 9654 96-Core Processor
cpu MHz		: 3700.000
`
	m := parseCPUInfo(strings.NewReader(info))
	if m.CPU != "AMD EPYC 9654 96-Core Processor" || m.MHz != "2396.400" || m.Cores != 2 {
		t.Errorf("parsed %+v", m)
	}
	m.Kernel, m.LoadAvg = "6.18.0", "0.10 0.20 0.30"
	if got, want := m.String(), "machine: AMD EPYC 9654 96-Core Processor at 2396.400 MHz, 2 cores, kernel 6.18.0, load average 0.10 0.20 0.30 at the start"; got != want {
		t.Errorf("line %q\nwant %q", got, want)
	}
}

func TestReadMachine(t *testing.T) {
	m, err := ReadMachine()
	if err != nil {
		t.Fatal(err)
	}
	if m.Cores < 1 || m.Kernel == "" || len(strings.Fields(m.LoadAvg)) != 3 {
		t.Errorf("this machine read as %+v", m)
	}
}
